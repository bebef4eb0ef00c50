"""The GRPOConfig fields the trainer wires (docs/config_fields.md), each against what its name says over discrete
actions: the sampling filters, ``loss_type``, ``off_policy_mask_threshold``, ``top_entropy_quantile``, the entropy
bonus and its adaptive controller, the reference sync, ``log_completions``, ``reward_weights``, and the trainer-init
audit fixes (tokenizer loading, MoE router loss)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer, TrainerCallback

from alea_trl import AleaEnvGRPOTrainer, AleaModel
from alea_trl.envs import make_env
from alea_trl.questions import Question
from alea_trl.trainer.act import filter_action_logits
from alea_trl.trainer.loss import ObjectiveSettings, grpo_loss
from alea_trl.trainer.loss.policy import Collectives, PolicyObjective, policy_loss
from alea_trl.trainer.rollout import Rollout
from alea_trl.trainer.rollout.pool import EpisodePool

from .conftest import TOY_FACTORIES
from .toy_envs import COLOURS, ThreeInARowEnv


# ------------------------------------------------------------------------------------------------------ helpers
def _rollout(tokenizer, make_args, factories=None, **overrides):
    factories = factories or {"kelly": lambda: make_env("kelly"), "nim": lambda: make_env("nim")}
    pool = EpisodePool(factories, eps_per_env=3, rng=np.random.default_rng(0))
    return Rollout(
        pool, tokenizer, make_args(**({"beta": 0.0} | overrides)), seed=0
    )  # driven by hand: no reference policy, no KL


def _act_logits(wave, seed=0):
    """Random act logits of the right width per decision."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(ep.env.observe().n_legal, generator=g) * 2 for ep in wave.episodes]


def _forward(logits: list[list[float]]):
    """A stand-in model output and batch: one act question per decision, with these option logits (a leaf)."""
    width = max(len(x) for x in logits)
    choice = torch.full((len(logits), width), float("-inf"))
    for i, x in enumerate(logits):
        choice[i, : len(x)] = torch.tensor(x)
    choice.requires_grad_(True)
    zeros = torch.zeros(1, 2)
    output = SimpleNamespace(
        choice_logits=choice, option_logits=zeros, noul_logits=zeros, quantiles=zeros, score_logits=zeros
    )
    questions = [[Question("act", "choice", "Pick?", options=[f"o{j}" for j in range(len(x))])] for x in logits]
    return output, SimpleNamespace(questions=questions)


def _inputs(actions, mask, advantages, old_logps, outcome=None):
    n = len(actions)
    return {
        "actions": torch.tensor(actions),
        "sample_mask": torch.tensor(mask),
        "advantages": torch.tensor(advantages),
        "old_logps": torch.tensor(old_logps),
        "outcome_rows": torch.tensor(outcome or [False] * n),
        "kl_report_mask": torch.zeros(n),
        "ref_logps": torch.zeros(n, 1),
        "packed": [None] * n,
        "targets": [{}] * n,
    }


def _loss(output, batch, inputs, temperature=1.0, entropy_coef=None, collectives=None, objective=None, **kwargs):
    kw = dict(temperature=temperature, epsilon_low=0.2, epsilon_high=0.2, beta=0.0, report_w=1.0, taus=(0.5,))
    kw["dense_update"] = "sampled"  # these inputs hold sampled actions only
    settings = ObjectiveSettings(**kw, **kwargs, policy=objective or PolicyObjective())
    return grpo_loss(output, batch, inputs, settings, entropy_coef=entropy_coef, collectives=collectives)


# ------------------------------------------------------------------------------------------- top_k, top_p, min_p
def test_top_k_one_draws_the_argmax_and_keeps_the_unfiltered_log_probs(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args, top_k=1, temperature=0.7)
    wave = rollout.observe_wave(6)
    logits = _act_logits(wave)
    rows = rollout.advance(wave, logits, None)
    below_one = 0
    for row, x in zip(rows, logits):
        assert set(row.actions) == {int(x.argmax())}
        want = torch.log_softmax(x / 0.7, -1)[row.actions]  # the policy's log-prob, not the filtered one (0)
        torch.testing.assert_close(torch.tensor(row.old_logps), want)
        below_one += int(want[0] < -1e-3)
    assert below_one > 0


@pytest.mark.parametrize("filters", [dict(top_p=0.5), dict(min_p=0.3), dict(top_k=2, top_p=0.9)])
def test_top_p_and_min_p_draw_only_the_kept_actions_in_proportion(tokenizer, make_args, filters):
    rollout = _rollout(tokenizer, make_args, num_generations=3000, **filters)
    wave = rollout.observe_wave(6)
    logits = _act_logits(wave, seed=4)
    rows = rollout.advance(wave, logits, None)
    narrowed = 0
    for row, x in zip(rows, logits):
        kept = torch.isfinite(filter_action_logits(torch.log_softmax(x, -1)[None], **filters))[0]
        assert all(kept[a] for a in row.actions)
        narrowed += int(kept.sum() < len(x))
        if len(row.actions) > 1:  # dense: k draws follow the renormalised distribution over the kept actions
            p = torch.softmax(x, -1) * kept
            freq = torch.bincount(torch.tensor(row.actions), minlength=len(x)).float() / len(row.actions)
            assert (freq - p / p.sum()).abs().max() < 0.04
    assert narrowed > 0


class RecordingEnv(ThreeInARowEnv):
    """Records every step of every copy (the list is the class's, so deep copies share it)."""

    steps: list = []

    def _step(self, action):
        RecordingEnv.steps.append((self.t, action))
        return super()._step(action)


@pytest.mark.parametrize("top_k", [1, 0])
def test_branch_continuations_draw_with_the_filters(tokenizer, make_args, top_k):
    rollout = _rollout(tokenizer, make_args, {"three_in_a_row": RecordingEnv}, outcome_advantage="branch", top_k=top_k)

    def continuation(packed):
        return torch.tensor([[0.0, 1.0, 0.5]] * len(packed))

    RecordingEnv.steps.clear()
    wave = rollout.observe_wave(3)
    rows = rollout.advance(
        wave, [torch.tensor([0.2, 0.1, 0.9])] * len(wave.episodes), None, continuation_logits=continuation
    )
    assert all(row.ready and len(row.actions) == 4 for row in rows)  # branched: k valued actions
    first = [a for t, a in RecordingEnv.steps if t == 0]
    later = [a for t, a in RecordingEnv.steps if t > 0]  # the policy's continuations in the copies
    assert len(later) >= 12
    if top_k == 1:
        assert set(first) == {2} and set(later) == {1}
    else:  # unfiltered: p = softmax([0, 1, 0.5]), 24 continuation draws are never all the argmax
        assert len(set(later)) > 1


# -------------------------------------------------------------------------------------------------- loss_type
# two dense rows (3 samples each) and an outcome row (one replayed sample)
LOGP = [[-0.7, -1.6, -1.2], [-0.5, -2.3, -2.0], [-0.9, 0.0, 0.0]]
SHIFT = [[0.3, -0.1, -0.5], [0.05, 0.4, -0.2], [-0.35, 0.0, 0.0]]  # logp - old_logp
ADV = [[1.0, -0.5, 0.7], [-1.2, 0.4, 0.9], [-0.8, 0.0, 0.0]]
MASK = [[True] * 3, [True] * 3, [True, False, False]]
OUTCOME = [False, False, True]


def _by_hand(loss_type: str, eps_low: float, eps_high: float, weight: float, samples_everywhere: float = 7.0) -> float:
    """TRL's per-token formulas (trl/trainer/grpo_trainer.py) written out per sample, a decision row in the place of
    a sequence and a sample in the place of a token; the outcome row's terms times ``weight``."""
    obj = PolicyObjective(loss_type=loss_type)
    row_sums, row_counts = [0.0, 0.0, 0.0], [0, 0, 0]
    for i in range(3):
        for j in range(3):
            if not MASK[i][j]:
                continue
            logp, a, r = LOGP[i][j], ADV[i][j], math.exp(SHIFT[i][j])
            if loss_type == "cispo":
                term = -min(r, eps_high) * a * logp
            elif loss_type == "sapo":
                t = obj.sapo_temperature_pos if a > 0 else obj.sapo_temperature_neg
                term = -4 / t / (1 + math.exp(-t * (r - 1))) * a
            elif loss_type == "vespo":
                k, lam = (obj.vespo_k_pos, obj.vespo_lambda_pos) if a >= 0 else (obj.vespo_k_neg, obj.vespo_lambda_neg)
                term = -math.exp(lam + k * math.log(r) - lam * r) * a * logp
            else:
                term = max(-a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high))
            row_sums[i] += term * (weight if OUTCOME[i] else 1.0)
            row_counts[i] += 1
    n_rows, k = 3, 3
    if loss_type in ("grpo", "sapo"):  # the mean over rows of each row's sample mean
        return sum(s / c for s, c in zip(row_sums, row_counts)) / n_rows
    if loss_type == "luspo":  # the mean over rows of each row's sample sum
        return sum(row_sums) / n_rows
    if loss_type == "bnpo":  # the micro-batch's real samples
        return sum(row_sums) / sum(row_counts)
    if loss_type == "dr_grpo":  # the constant rows x k
        return sum(row_sums) / (n_rows * k)
    return sum(row_sums) / samples_everywhere  # dapo / cispo / vespo: the real samples of all processes / processes


def _policy_loss(loss_type, eps_high, weight, collectives=None):
    logp = torch.tensor(LOGP, requires_grad=True)
    old = torch.tensor(LOGP) - torch.tensor(SHIFT)
    obj = PolicyObjective(loss_type=loss_type)
    loss, _ = policy_loss(
        logp, old, torch.tensor(ADV), torch.tensor(MASK), 0.2, eps_high, None, torch.tensor(OUTCOME), weight,
        objective=obj, collectives=collectives,
    )  # fmt: skip
    loss.backward()
    return loss, logp.grad


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "luspo", "dr_grpo", "dapo", "cispo", "sapo", "vespo"])
def test_loss_type_matches_trls_formula_by_hand(loss_type):
    eps_high = 1.3 if loss_type == "cispo" else 0.28  # cispo: the cap of its weight
    loss, grad = _policy_loss(loss_type, eps_high, weight=0.5)
    want = _by_hand(loss_type, 0.2, eps_high, 0.5)
    torch.testing.assert_close(loss, torch.tensor(want))
    if loss_type in ("cispo", "vespo"):  # detached weights: d/dlogp = -weight x A / count
        r = torch.tensor(SHIFT).exp()
        if loss_type == "cispo":
            w = r.clamp(max=eps_high)
        else:
            lam = torch.where(torch.tensor(ADV) >= 0, 3.0, 2.0)
            k = torch.where(torch.tensor(ADV) >= 0, 2.0, 3.0)
            w = torch.exp(lam + k * r.log() - lam * r)
        scale = torch.tensor([[1 / 7] * 3, [1 / 7] * 3, [0.5 / 7, 0.0, 0.0]])  # 7 real samples; the outcome row x 0.5
        torch.testing.assert_close(grad, -w * torch.tensor(ADV) * scale)


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "vespo"])
def test_global_count_losses_divide_by_all_processes_samples(loss_type):
    """dapo / cispo / vespo: the sum over the micro-batch's samples / (the real samples of all processes / their
    number); here a second process holds 3 samples, so the divisor is (7 + 3) / 2."""
    calls = []

    def other_process(t):
        calls.append(t.clone())
        return t + 3.0

    eps_high = 1.3 if loss_type == "cispo" else 0.28
    loss, _ = _policy_loss(loss_type, eps_high, 1.0, Collectives(sum=other_process, num_processes=2))
    torch.testing.assert_close(loss, torch.tensor(_by_hand(loss_type, 0.2, eps_high, 1.0, (7 + 3) / 2)))
    assert len(calls) == 1 and calls[0].tolist() == [7.0]  # one collective per micro-batch


# ------------------------------------------------------------------------------------- off_policy_mask_threshold
def test_off_policy_mask_drops_drifted_samples_with_negative_advantage():
    """keep = (A >= 0) | (old_logp - logp <= threshold), per sample; the normaliser is unchanged (as TRL)."""
    logp = torch.log(torch.tensor([[0.3, 0.3, 0.3, 0.3]])).requires_grad_(True)
    drift = torch.tensor([[0.5, 0.05, 0.5, 0.05]])  # old_logp - logp
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0]])
    obj = PolicyObjective(off_policy_mask_threshold=0.1)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, _ = policy_loss(logp, logp.detach() + drift, adv, mask, 0.9, 0.9, objective=obj)
    loss.backward()
    r = torch.exp(-drift)[0]
    torch.testing.assert_close(loss, (r[1] - r[2] - r[3]) / 4)  # -A r of the kept samples, over all 4
    assert logp.grad[0, 0] == 0 and (logp.grad[0, 1:] != 0).all()


# -------------------------------------------------------------------------------------------- top_entropy_quantile
ENTROPY_ROWS = [[0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0]]  # H: 1.39, 0.10, 0.95, 0.69


def test_top_entropy_quantile_trains_the_high_entropy_decisions():
    output, batch = _forward(ENTROPY_ROWS)
    adv = [[1.0, -0.5], [2.0, 1.0], [0.5, 0.7], [-1.0, 3.0]]
    logp = torch.log_softmax(output.choice_logits.detach(), -1)
    actions = [[0, 1], [0, 1], [0, 2], [1, 0]]
    old = [[float(logp[i, a]) for a in acts] for i, acts in enumerate(actions)]
    inputs = _inputs(actions, [[True, True]] * 4, adv, old)
    loss, _ = _loss(output, batch, inputs, objective=PolicyObjective(top_entropy_quantile=0.5))
    loss.backward()
    # the median of the 8 samples' entropies lies between rows 3 (0.69) and 2 (0.95): rows 0 and 2 train
    torch.testing.assert_close(loss, torch.tensor(-(1.0 - 0.5 + 0.5 + 0.7) / 8))
    grad = output.choice_logits.grad.nan_to_num(0.0)
    assert grad[[0, 2]].abs().sum() > 0 and grad[[1, 3]].abs().sum() == 0


def test_top_entropy_quantile_threshold_spans_all_processes():
    """The threshold is a quantile over every process's samples: another process's higher entropies lift it above
    all of this process's decisions."""
    output, batch = _forward(ENTROPY_ROWS)
    inputs = _inputs([[0, 1]] * 4, [[True, True]] * 4, [[1.0, -1.0]] * 4, [[-1.0, -1.0]] * 4)
    gathered = []

    def gather(x):
        gathered.append(x)
        return torch.cat([x, torch.full((8,), 5.0)])

    loss, _ = _loss(
        output,
        batch,
        inputs,
        objective=PolicyObjective(top_entropy_quantile=0.5),
        collectives=Collectives(gather=gather),
    )
    assert len(gathered) == 1 and len(gathered[0]) == 8 and loss.item() == 0.0


# ------------------------------------------------------------------------------------------------ entropy_coef
def test_entropy_bonus_is_the_mean_act_entropy_of_the_training_decisions():
    rows = [[1.0, 0.0, -1.0], [2.0, 0.5], [0.0, 3.0, 0.0, 1.0], [0.3, 0.1]]
    output, batch = _forward(rows)
    mask = [[True, True], [True, False], [True, True], [False, False]]  # the last decision's action does not train
    inputs = _inputs([[0, 1], [1, 0], [3, 2], [0, 0]], mask, [[0.0, 0.0]] * 4, [[0.0, 0.0]] * 4)
    loss, terms = _loss(output, batch, inputs, temperature=0.7, entropy_coef=0.3)
    loss.backward()
    leaves = [torch.tensor(x, requires_grad=True) for x in rows[:3]]
    h = torch.stack([_entropy_of(x, 0.7) for x in leaves])
    want = -0.3 * h.mean()
    want.backward()
    torch.testing.assert_close(loss, want.detach())
    for i, leaf in enumerate(leaves):
        torch.testing.assert_close(output.choice_logits.grad[i, : len(rows[i])], leaf.grad)
    assert (output.choice_logits.grad[3].nan_to_num(0.0) == 0).all()
    torch.testing.assert_close(terms.entropy_bonus[0], h.sum().detach())
    assert terms.entropy_bonus[1] == 3


def _entropy_of(x: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(x / temperature, -1)
    return -(logp.exp() * logp).sum()


def _last_logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h][-1]


def test_entropy_coef_raises_the_act_entropy(tiny_model, tokenizer, make_args):
    def entropy_after(coef):
        args = make_args(envs=["named_best"], entropy_coef=coef, beta=0.0, max_steps=5, seed=1)
        trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
        trainer.train()
        return _last_logged(trainer, "env/named_best/entropy"), trainer

    without, _ = entropy_after(0.0)
    with_bonus, trainer = entropy_after(1.0)
    assert with_bonus > without + 0.02
    assert _last_logged(trainer, "entropy_coef") == 1.0


def test_adaptive_entropy_coef_moves_towards_the_target(tiny_model, tokenizer, make_args):
    def coefs(**overrides):
        args = make_args(envs=["named_best"], use_adaptive_entropy=True, entropy_coef_delta=0.1, **overrides)
        trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
        trainer.train()
        return [h["entropy_coef"] for h in trainer.state.log_history if "entropy_coef" in h], trainer, args

    # every entropy is below a target of 100 nats: the bonus grows by delta per optimizer step, up to the max
    grown, trainer, args = coefs(entropy_coef=0.0, entropy_coef_max=0.25, entropy_target=100.0)
    assert grown == pytest.approx([0.1, 0.2, 0.25])
    assert 0 < trainer._last_world_entropy < math.log(4) + 1e-6
    # above a target of 0: it shrinks to the min; GRPOTrainer saves the controller's state with a checkpoint
    shrunk, trainer, args = coefs(
        entropy_coef=0.3, entropy_coef_min=0.05, entropy_target=0.0, save_strategy="steps", save_steps=3
    )
    assert shrunk == pytest.approx([0.2, 0.1, 0.05])
    state = json.loads((Path(args.output_dir) / "checkpoint-3" / "entropy_ctrl_state.json").read_text())
    assert state == {"entropy_coef": trainer.entropy_coef, "last_world_entropy": trainer._last_world_entropy}


# ----------------------------------------------------------------------------------------------- sync_ref_model
def test_sync_ref_model_mixes_the_policy_into_the_reference(tiny_model, tokenizer, make_args):
    args = make_args(
        envs=["named_best"], beta=0.05, sync_ref_model=True, ref_model_mixup_alpha=0.3, ref_model_sync_steps=2
    )
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    ref, policy = trainer.ref_model, trainer.accelerator.unwrap_model(trainer.model)
    init = {n: p.detach().clone() for n, p in ref.named_parameters()}
    seen = {}

    class Snapshot(TrainerCallback):  # added after the sync callback: sees each step's synced reference
        def on_step_end(self, args, state, control, **kwargs):
            seen[state.global_step] = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in (ref, policy)]

    trainer.add_callback(Snapshot())
    trainer.train()
    (ref1, _), (ref2, policy2), (ref3, _) = seen[1], seen[2], seen[3]
    assert all(torch.equal(ref1[n], init[n]) for n in init)  # no sync before ref_model_sync_steps
    for name in init:
        torch.testing.assert_close(ref2[name], 0.7 * init[name] + 0.3 * policy2[name])
    assert any(not torch.equal(ref2[n], init[n]) for n in init)
    assert all(torch.equal(ref3[n], ref2[n]) for n in init)


# ---------------------------------------------------------------------------------------------- log_completions
@pytest.mark.parametrize("sample_in_loss_forward", [True, False])
def test_log_completions_writes_trls_table_of_sampled_actions(
    tiny_model, tokenizer, make_args, sample_in_loss_forward
):
    args = make_args(
        envs=["named_best", "three_in_a_row"], log_completions=True, sample_in_loss_forward=sample_in_loss_forward
    )
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    trainer.train()
    table = pd.read_parquet(Path(args.output_dir) / "completions" / "completions_00001.parquet")
    assert {"step", "prompt", "completion", "reward", "env", "advantage"} <= set(table.columns)
    assert 0 < len(table) <= args.generation_batch_size * args.num_generations
    assert (table["step"] == 1).all() and set(table["completion"]) <= set(COLOURS)
    assert all(p.startswith(f"{e}: The winning colour is") for p, e in zip(table["prompt"], table["env"]))
    dense = table[table["env"] == "named_best"]
    # the default dense update trains each of a dense decision's 4 legal actions once: those are logged
    assert len(dense) > 0 and len(dense) % 4 == 0
    for start in range(0, len(dense), 4):
        decision = dense.iloc[start : start + 4]
        assert decision["prompt"].nunique() == 1 and decision["completion"].nunique() == 4
    # a dense action's reward is its exact expected reward (1 for the colour the state names), and only that
    # action is better than the policy's average
    best = [f"is {c}." in p for c, p in zip(dense["completion"], dense["prompt"])]
    assert all((r == 1.0) == b for r, b in zip(dense["reward"], best))
    assert all((a > 0) == b for a, b in zip(dense["advantage"], best))


# ----------------------------------------------------------------------------------------------- reward_weights
def test_reward_weights_multiply_every_reward(tokenizer, make_args):
    def run(**overrides):
        rollout = _rollout(tokenizer, make_args, scale_rewards="none", **overrides)
        out = []
        for seed in range(12):
            wave = rollout.observe_wave(6)
            rows = rollout.advance(wave, _act_logits(wave, seed), None)
            out += [row for row in rows if row is not None and row.ready]
        return out + rollout.take(1000)  # outcome rows whose episode ended

    plain, weighted = run(), run(reward_weights=[2.0])
    assert len(plain) == len(weighted) and any(row.outcome for row in plain) and any(not r.outcome for r in plain)
    for a, b in zip(plain, weighted):
        assert a.actions == b.actions
        assert b.values == [2 * v for v in a.values] and b.advantages == [2 * x for x in a.advantages]
    assert any(v != 0 for row in plain if row.outcome for v in row.values)


# ----------------------------------------------------------------------------------------------- trainer init
def test_tokenizer_loads_with_the_models_revision_and_trust_remote_code(
    tiny_model, tokenizer, make_args, tmp_path, monkeypatch
):
    path = str(tmp_path / "alea")
    tiny_model().save_pretrained(path)
    tokenizer.save_pretrained(path)
    calls, load = [], AutoTokenizer.from_pretrained

    def spy(name, **kwargs):
        calls.append((name, kwargs))
        return load(name)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy)
    args = make_args(envs=["named_best"], model_init_kwargs={"revision": "main"}, trust_remote_code=True)
    AleaEnvGRPOTrainer(path, args=args, env_factories=TOY_FACTORIES)
    assert calls == [(path, {"revision": "main", "trust_remote_code": True})]


def test_moe_backbone_is_refused_unless_router_aux_loss_coef_is_zero(tokenizer, make_args):
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=2, num_experts_per_tok=1,
    )  # fmt: skip
    assert config.router_aux_loss_coef != 0
    model = AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32})
    kwargs = dict(processing_class=tokenizer, env_factories=TOY_FACTORIES)
    with pytest.raises(ValueError, match=r"^AleaEnvGRPOTrainer: field 'router_aux_loss_coef': .+ set router_aux"):
        AleaEnvGRPOTrainer(model, args=make_args(envs=["named_best"]), **kwargs)
    trainer = AleaEnvGRPOTrainer(model, args=make_args(envs=["named_best"], router_aux_loss_coef=0.0), **kwargs)
    assert not trainer.aux_loss_enabled


# ------------------------------------------------------------------------------------------------- stale replays
def test_the_default_delta_bounds_a_stale_replay(make_args):
    """A replayed outcome action whose probability grew 50-fold since it was sampled, with A = -1: without a cap its
    term is 50; the default ``delta`` (4) bounds it, and an on-policy sample is untouched."""
    args = make_args()
    assert args.delta == 4.0
    logp, mask, outcome = torch.tensor([[math.log(0.5)]]), torch.ones(1, 1, dtype=torch.bool), torch.tensor([True])

    def term(ratio, delta):
        old = logp - math.log(ratio)
        loss, _ = policy_loss(logp, old, torch.tensor([[-1.0]]), mask, 0.2, 0.2, delta, outcome, 1.0)
        return loss.item()

    assert term(50.0, None) == pytest.approx(50.0) and term(50.0, args.delta) == pytest.approx(4.0)
    assert term(1.0, args.delta) == pytest.approx(term(1.0, None))
    assert make_args(delta=None, loss_type="cispo", dense_update="sampled").delta is None  # off, with any loss
    with pytest.raises(ValueError, match="entropy_coef_delta"):  # None is "off" only for a field that allows it
        make_args(entropy_coef_delta=None)


def test_replay_ratios_are_logged(tiny_model, tokenizer, make_args):
    args = make_args(envs=["three_in_a_row"], max_steps=6, outcome_advantage="rtg")
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "replay/ratio_max" in h]
    assert logged and all(h["replay/ratio_max"] >= h["replay/ratio_p90"] > 0 for h in logged)
