"""Every GRPOConfig field works or refuses: the refusals name their field, the knobs the trainer acts on are accepted
with valid values, docs/config_fields.md lists every field, and the act-sampling filters match transformers'."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from transformers import TrainingArguments
from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from trl import GRPOConfig

from alea_trl.trainer.act import filter_action_logits, sampling_filters_active
from alea_trl.trainer.config_checks import ALLOWED, DEFAULT_ONLY, NEEDS_SWITCH


DOC = Path(__file__).resolve().parents[2] / "docs" / "config_fields.md"

# a value with no meaning for decisions, per refused field (every entry of DEFAULT_ONLY must have one)
REFUSED_VALUES = {
    "use_vllm": True,
    "vllm_mode": "server",
    "vllm_model_impl": "transformers",
    "vllm_enable_sleep_mode": True,
    "vllm_structured_outputs_regex": "a+",
    "vllm_server_base_url": "http://localhost:8000",
    "vllm_server_host": "127.0.0.1",
    "vllm_server_port": 8001,
    "vllm_server_timeout": 10.0,
    "vllm_group_port": 51217,
    "vllm_gpu_memory_utilization": 0.5,
    "vllm_max_model_length": 1024,
    "vllm_tensor_parallel_size": 2,
    "vllm_importance_sampling_correction": False,
    "vllm_importance_sampling_mode": "token_mask",
    "vllm_importance_sampling_clip_max": 2.0,
    "vllm_importance_sampling_clip_min": 0.5,
    "vllm_importance_sampling_cap": 2.0,
    "use_transformers_continuous_batching": True,
    "use_transformers_paged": True,
    "transformers_continuous_batching_config": {"max_memory_percent": 0.5},
    "cast_lm_head_to_fp32": True,
    "max_completion_length": 64,
    "repetition_penalty": 1.1,
    "cache_implementation": "static",
    "max_tool_calling_iterations": 3,
    "mask_truncated_completions": True,
    "num_generations_eval": 4,
    "multi_objective_aggregation": "normalize_then_sum",
    "use_bias_correction_kl": False,
    "remove_unused_columns": True,
    # accepted only in some forms
    "generation_kwargs": {"num_beams": 2},
    "chat_template_kwargs": {"enable_thinking": False},
    "pad_to_multiple_of": 64,
    "router_aux_loss_coef": 0.01,
    "reward_weights": [1.0, 2.0],
    # only act with their switch on (the switches are off by default)
    "ref_model_mixup_alpha": 0.9,
    "ref_model_sync_steps": 64,
    "entropy_coef_min": 0.1,
    "entropy_coef_max": 0.5,
    "entropy_coef_delta": 0.01,
    "entropy_target": 1.0,
    "num_completions_to_print": 3,
    "log_unique_prompts": True,
    "log_completions_hub_repo": "me/decision-logs",
    "sapo_temperature_neg": 2.0,
    "sapo_temperature_pos": 2.0,
    "vespo_k_pos": 1.0,
    "vespo_lambda_pos": 1.0,
    "vespo_k_neg": 1.0,
    "vespo_lambda_neg": 1.0,
}

# the fields that act on sampled actions (loss_type other than grpo / bnpo, top_entropy_quantile,
# off_policy_mask_threshold) are tested with dense_update="sampled": every other update, the default included, refuses
# them
SAMPLED = dict(dense_update="sampled")

# (overrides, the field the error must name): invalid values and meaningless combinations of acting fields
REFUSED_COMBINATIONS = [
    (dict(**SAMPLED, delta=3.0, loss_type="sapo"), "delta"),
    (dict(**SAMPLED, delta=3.0, loss_type="cispo"), "delta"),
    (dict(delta=0.0), "delta"),
    (dict(**SAMPLED, epsilon=0.3, loss_type="vespo"), "epsilon"),
    (dict(**SAMPLED, epsilon=0.3, epsilon_high=5.0, loss_type="cispo"), "epsilon"),
    (dict(**SAMPLED, epsilon_high=0.28, loss_type="sapo"), "epsilon_high"),
    (dict(reward_weights=[]), "reward_weights"),
    (dict(reward_weights=[float("nan")]), "reward_weights"),
    (dict(loss_type="ppo"), "loss_type"),
    (dict(importance_sampling_level="episode"), "importance_sampling_level"),
    (dict(scale_rewards="per_env"), "scale_rewards"),
    (dict(temperature=0.0), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(top_entropy_quantile=1.5), "top_entropy_quantile"),
    (dict(off_policy_mask_threshold=-0.1), "off_policy_mask_threshold"),
    (dict(use_adaptive_entropy=True, entropy_coef_min=0.5, entropy_coef_max=0.1), "entropy_coef_max"),
    (dict(use_adaptive_entropy=True, entropy_coef_delta=-0.1), "entropy_coef_delta"),
    (dict(sync_ref_model=True, beta=0.0), "sync_ref_model"),
    (dict(sync_ref_model=True, train_mode="lora"), "sync_ref_model"),
    (dict(sync_ref_model=True, ref_model_mixup_alpha=0.0), "ref_model_mixup_alpha"),
    (dict(sync_ref_model=True, ref_model_sync_steps=0), "ref_model_sync_steps"),
    (dict(steps_per_generation=2), "steps_per_generation"),
    (dict(generation_batch_size=8), "generation_batch_size"),
    (dict(num_generations_per_env={"chess": 16}), "num_generations_per_env"),
    (dict(num_generations_per_env={"nim": 1}), "num_generations_per_env"),
    (dict(num_generations_per_env={"nim": 1.5}), "num_generations_per_env"),
    (dict(num_generations_per_env="nim=16"), "num_generations_per_env"),
    (dict(dense_update="every"), "dense_update"),
    (dict(loss_type="dapo"), "loss_type"),  # the default dense_update="all_actions_ascent" refuses these three
    (dict(top_entropy_quantile=0.5), "top_entropy_quantile"),
    (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold"),
]

# valid values of the fields the trainer acts on: accepted
ACCEPTED = [
    dict(dense_update="all_actions", loss_type="bnpo", delta=3.0, entropy_coef=0.01),
    dict(dense_update="sampled"),
    dict(top_k=3, top_p=0.9, min_p=0.05),
    *[
        dict(**SAMPLED, loss_type=loss)
        for loss in ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
    ],
    dict(delta=3.0, epsilon_high=0.28),
    dict(**SAMPLED, loss_type="cispo", epsilon_high=5.0),
    dict(**SAMPLED, loss_type="sapo", sapo_temperature_neg=2.0, sapo_temperature_pos=0.5),
    dict(**SAMPLED, loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_pos=1.0, vespo_k_neg=1.0, vespo_lambda_neg=1.0),
    dict(importance_sampling_level="sequence"),
    dict(**SAMPLED, off_policy_mask_threshold=0.5, top_entropy_quantile=0.2, entropy_coef=0.01),
    dict(use_adaptive_entropy=True, entropy_coef_min=0.0, entropy_coef_max=0.5, entropy_coef_delta=0.01),
    dict(sync_ref_model=True, beta=0.05, ref_model_mixup_alpha=0.9, ref_model_sync_steps=64),
    dict(log_completions=True, num_completions_to_print=3, log_unique_prompts=True),
    dict(reward_weights=[2.0], router_aux_loss_coef=0.0, pad_to_multiple_of=None, generation_kwargs={}),
    dict(disable_dropout=True, shuffle_dataset=False, log_multimodal=False, ds3_gather_for_generation=False),
    dict(steps_per_generation=2, sample_in_loss_forward=False),
    dict(steps_per_generation=2, num_iterations=2),
    dict(gradient_accumulation_steps=2, steps_per_generation=2),
    dict(num_generations_per_env={"nim": 16, "bandit": 2}),
]


def _grpo_fields() -> list[str]:
    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f.name for f in dataclasses.fields(GRPOConfig) if f.name not in base]


def test_every_refusal_table_entry_has_a_test_value():
    # `delta` is refused only with a loss that does not clip (its switch, loss_type, defaults to one that does)
    assert set(DEFAULT_ONLY) | set(ALLOWED) | set(NEEDS_SWITCH) == set(REFUSED_VALUES) | {"delta"}


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_refused_field_is_named(make_args, name):
    with pytest.raises(ValueError, match=rf"^AleaEnvGRPOConfig: field '{name}': .+; .+"):
        make_args(**{name: REFUSED_VALUES[name]})


@pytest.mark.parametrize("overrides, name", REFUSED_COMBINATIONS, ids=[n for _, n in REFUSED_COMBINATIONS])
def test_meaningless_value_or_combination_is_named(make_args, overrides, name):
    with pytest.raises(ValueError, match=rf"^AleaEnvGRPOConfig: field '{name}': "):
        make_args(**overrides)


@pytest.mark.parametrize("overrides", ACCEPTED, ids=lambda o: ",".join(o))
def test_acting_fields_are_accepted(make_args, overrides):
    args = make_args(**overrides)
    for name, value in overrides.items():
        if name != "pad_to_multiple_of":  # resolved by GRPOConfig ("auto" / None -> None off Neuron)
            assert getattr(args, name) == value


def test_defaults_are_accepted(make_args):
    args = make_args()
    # loss_type: "grpo" (the mean over sampled actions), not GRPOConfig's "dapo"; dense decisions
    # train by every legal action
    assert (args.loss_type, args.top_k, args.top_p, args.min_p) == ("grpo", 0, 1.0, None)
    assert args.dense_update == "all_actions_ascent"


def test_trust_remote_code_reaches_the_model_loaders(make_args):
    assert make_args(trust_remote_code=True).model_init_kwargs == {"trust_remote_code": True}
    kwargs = make_args(trust_remote_code=True, model_init_kwargs={"dtype": "float32"}).model_init_kwargs
    assert kwargs == {"trust_remote_code": True, "dtype": "float32"}
    assert make_args().model_init_kwargs is None


def test_doc_lists_every_grpo_field_once():
    rows = re.findall(r"^\| `(\w+)` \|", DOC.read_text(), re.M)
    assert sorted(rows) == sorted(_grpo_fields())
    assert len(_grpo_fields()) == 77  # trl 1.16; a new TRL field needs a decision (and a row)


# ------------------------------------------------------------------------------------------------ sampling filters
NEG_INF = float("-inf")


def _rows(seed: int, n: int = 40, width: int = 9) -> tuple[torch.Tensor, list[int]]:
    """Random act logits `(n, width)` with 1..width legal actions per row (``-inf`` beyond), no ties."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, width, generator=g) * 2.0
    n_legal = torch.randint(1, width + 1, (n,), generator=g).tolist()
    for i, m in enumerate(n_legal):
        logits[i, m:] = NEG_INF
    return logits, n_legal


def _reference(logits: torch.Tensor, n_legal: list[int], warpers) -> torch.Tensor:
    """transformers' warpers applied to each row's legal actions alone, padded back with ``-inf``."""
    out = torch.full_like(logits, NEG_INF)
    for i, m in enumerate(n_legal):
        row = logits[i : i + 1, :m]
        for warper in warpers:
            row = warper(None, row)
        out[i, :m] = row[0]
    return out


@pytest.mark.parametrize("top_k", [1, 2, 3, 5, 20])
def test_top_k_matches_transformers(top_k):
    logits, n_legal = _rows(top_k)
    expected = _reference(logits, n_legal, [TopKLogitsWarper(top_k)])
    assert torch.equal(filter_action_logits(logits, top_k=top_k), expected)


@pytest.mark.parametrize("top_p", [0.01, 0.3, 0.5, 0.8, 0.95, 0.999])
def test_top_p_matches_transformers(top_p):
    logits, n_legal = _rows(int(top_p * 1000))
    expected = _reference(logits, n_legal, [TopPLogitsWarper(top_p)])
    assert torch.equal(filter_action_logits(logits, top_p=top_p), expected)


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.2, 0.5, 1.0])
def test_min_p_matches_transformers(min_p):
    logits, n_legal = _rows(int(min_p * 100) + 7)
    expected = _reference(logits, n_legal, [MinPLogitsWarper(min_p)])
    assert torch.equal(filter_action_logits(logits, min_p=min_p), expected)


@pytest.mark.parametrize("top_k, top_p, min_p", [(4, 0.9, 0.1), (2, 0.5, None), (0, 0.7, 0.3), (6, 1.0, 0.05)])
def test_filters_chain_in_generate_order(top_k, top_p, min_p):
    """top-k, then top-p, then min-p, each on the survivors of the previous, as ``generate`` orders its warpers."""
    logits, n_legal = _rows(11)
    warpers = [TopKLogitsWarper(top_k)] if top_k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
    warpers += [MinPLogitsWarper(min_p)] if min_p is not None else []
    expected = _reference(logits, n_legal, warpers)
    assert torch.equal(filter_action_logits(logits, top_k=top_k, top_p=top_p, min_p=min_p), expected)


def test_log_probs_filter_like_logits():
    logits, _ = _rows(3)
    log_probs = torch.log_softmax(logits, -1)
    kept = torch.isfinite(filter_action_logits(logits, top_k=3, top_p=0.8, min_p=0.1))
    assert torch.equal(torch.isfinite(filter_action_logits(log_probs, top_k=3, top_p=0.8, min_p=0.1)), kept)


def test_off_filters_return_the_input():
    logits, _ = _rows(5)
    assert filter_action_logits(logits) is logits
    assert not sampling_filters_active() and sampling_filters_active(top_k=1) and sampling_filters_active(min_p=0.0)


def test_most_likely_legal_action_always_survives():
    logits, _ = _rows(13, n=200)
    out = filter_action_logits(logits, top_k=1, top_p=1e-6, min_p=1.0)
    best = logits.argmax(-1, keepdim=True)
    assert torch.equal(out.gather(1, best), logits.gather(1, best))
    assert torch.isfinite(out).sum(-1).eq(1).all()
    one_legal = torch.tensor([[0.5, NEG_INF, NEG_INF]])
    assert torch.equal(filter_action_logits(one_legal, top_p=0.1, min_p=0.9), one_legal)


def test_ties_at_the_boundary_all_survive():
    tied = torch.tensor([[1.0, 2.0, 2.0, 0.0, NEG_INF]])
    assert torch.isfinite(filter_action_logits(tied, top_k=1)).tolist() == [[False, True, True, False, False]]
    # the two tied actions hold ~80% of the mass: top_p=0.3 keeps one in transformers (by sort position), both here
    assert torch.isfinite(filter_action_logits(tied, top_p=0.3)).tolist() == [[False, True, True, False, False]]
    assert torch.isfinite(filter_action_logits(tied, min_p=1.0)).tolist() == [[False, True, True, False, False]]


def test_illegal_actions_stay_illegal_and_dtype_is_kept():
    logits, n_legal = _rows(17)
    out = filter_action_logits(logits.to(torch.bfloat16), top_k=2, top_p=0.9, min_p=0.1)
    assert out.dtype == torch.bfloat16
    for i, m in enumerate(n_legal):
        assert not torch.isfinite(out[i, m:]).any()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(top_k=-1), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.2), "top_p"),
        (dict(min_p=-0.1), "min_p"),
    ],
)
def test_bad_filter_values_are_named(kwargs, name):
    with pytest.raises(ValueError, match=f"field '{name}'"):
        filter_action_logits(torch.zeros(2, 3), **kwargs)


def test_a_row_without_legal_actions_is_an_error():
    with pytest.raises(ValueError, match="field 'logits'"):
        filter_action_logits(torch.tensor([[0.0, 1.0], [NEG_INF, NEG_INF]]), top_k=1)


def test_num_generations_per_env_takes_json_from_the_command_line(make_args):
    assert make_args(num_generations_per_env='{"nim": 16}').num_generations_per_env == {"nim": 16}
    assert make_args().num_generations_per_env == {}
