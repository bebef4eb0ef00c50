"""AleaEnvGRPOTrainer: TRL contract, what trains and what stays frozen, learning, errors."""

import numpy as np
import pytest
import torch
import trl

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer
from alea_trl.envs import BUILTIN_ENVS

from .conftest import TOY_FACTORIES
from .toy_envs import NamedBestEnv


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_all_five_envs_train_and_every_trainable_parameter_changes(tiny_model, tokenizer, make_args):
    model = tiny_model(use_aux_embed=True, use_bigram=True)
    args = make_args(envs=list(BUILTIN_ENVS), max_steps=3, beta=0.05)
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    assert isinstance(trainer, trl.GRPOTrainer)
    before = _snapshot(model)
    trainer.train()
    assert "train_loss" in trainer.state.log_history[-1]
    logged = {k for h in trainer.state.log_history for k in h}
    for env in BUILTIN_ENVS:
        assert f"env/{env}/entropy" in logged
    assert {"loss/policy", "loss/kl", "loss/report", "decisions_per_s", "report/noul"} <= logged
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, f"parameters that did not train: {unchanged}"


def test_heads_mode_leaves_the_backbone_unchanged(tiny_model, tokenizer, make_args):
    model = tiny_model()
    trainer = AleaEnvGRPOTrainer(
        model, args=make_args(envs=["kelly", "nim"], train_mode="heads", max_steps=2), processing_class=tokenizer
    )
    before = _snapshot(model)
    trainer.train()
    for name, p in model.named_parameters():
        changed = not torch.equal(p, before[name])
        assert changed == (not name.startswith("backbone.")), name


def test_tail_mode_trains_only_the_last_layers_and_final_norm(tiny_model, tokenizer, make_args):
    model = tiny_model()
    args = make_args(envs=["hmm", "kelly"], train_mode="tail", tail_k=1, max_steps=2)  # all four heads in use
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    before = _snapshot(model)
    trainer.train()
    for name, p in model.named_parameters():
        changed = not torch.equal(p, before[name])
        frozen = name.startswith("backbone.layers.0.") or name.startswith("backbone.embed_tokens")
        assert changed == (not frozen), name


def _expected_reward(model, tokenizer, n=200, seed=123):
    """Mean over fresh decisions of sum_a pi(a) R(a): the policy's exact expected reward."""
    envs = [NamedBestEnv().reset(np.random.default_rng([seed, i])) for i in range(n)]
    answers = model.predict([e.observe() for e in envs], tokenizer, batch_size=50)
    return float(np.mean([float(a["act"] @ torch.tensor(e.action_rewards())) for a, e in zip(answers, envs)]))


def test_learns_dense_env_and_report(tiny_model, tokenizer, make_args):
    model = tiny_model()
    start = _expected_reward(model, tokenizer)
    assert 0.15 < start < 0.35  # about 1 / n_legal = 0.25 at init
    args = make_args(
        envs=["named_best"],
        max_steps=60,
        eps_per_env=16,
        max_batch=16,
        per_device_train_batch_size=16,
        num_generations=8,
        beta=0.0,
        logging_steps=10,
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    trainer.train()
    assert _expected_reward(model, tokenizer) >= 0.9
    report = [h["report/noul"] for h in trainer.state.log_history if "report/noul" in h]
    assert report[-1] < 0.5 * report[0]  # the "is it red?" forecast is learnt too


def test_learns_outcome_env_through_replay(tiny_model, tokenizer, make_args):
    from alea_trl.evaluation import evaluate_policy

    model = tiny_model()
    chance = evaluate_policy(model, tokenizer, TOY_FACTORIES, episodes=200, greedy=False)["three_in_a_row"]["return"]
    # sparse reward (chance 1/27): a gentler step than the dense test keeps the tiny model from collapsing
    args = make_args(
        envs=["three_in_a_row"],
        max_steps=200,
        eps_per_env=16,
        max_batch=16,
        per_device_train_batch_size=16,
        beta=0.0,
        logging_steps=10,
        learning_rate=4e-4,
        lr_head=4e-4,
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    trainer.train()
    after = evaluate_policy(model, tokenizer, TOY_FACTORIES, episodes=200, greedy=False)["three_in_a_row"]["return"]
    assert chance < 0.1 and after > 0.15 and after > 4 * chance


def test_kl_is_zero_at_the_first_step_and_positive_after(tiny_model, tokenizer, make_args):
    model = tiny_model()
    args = make_args(envs=["named_best"], max_steps=4, beta=0.1)
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    trainer.train()
    kls = [h["loss/kl"] for h in trainer.state.log_history if "loss/kl" in h]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[-1] > 1e-6


def test_evaluate_logs_per_env_scores(tiny_model, tokenizer, make_args):
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=make_args(envs=["kelly", "bandit"]), processing_class=tokenizer)
    metrics = trainer.evaluate()
    for env in ("kelly", "bandit"):
        for key in ("return", "oracle", "random", "normalized_score"):
            assert np.isfinite(metrics[f"eval_{env}/{key}"])
        assert metrics[f"eval_{env}/oracle"] > metrics[f"eval_{env}/random"] - 1e-9
    assert "eval_kelly/report/regress" in metrics and "eval_bandit/report/choice" in metrics
    assert np.isfinite(metrics["eval_kelly/expected_score"]) and "eval_bandit/expected_score" not in metrics
    # the trainer's table is evaluate_policy's on the same episodes (seed + 1, greedy)
    from alea_trl.evaluation import evaluate_policy

    table = evaluate_policy(
        trainer.model, tokenizer, ["kelly"], episodes=trainer.args.eval_episodes, seed=trainer.args.seed + 1
    )["kelly"]
    for key in ("normalized_score", "expected_score", "regret"):
        assert metrics[f"eval_kelly/{key}"] == pytest.approx(table[key], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (dict(use_vllm=True), "use_vllm"),
        (dict(num_generations=1), "num_generations"),
        (dict(train_mode="everything"), "train_mode"),
        (dict(max_steps=-1), "max_steps"),
    ],
)
def test_config_errors(make_args, overrides, needle):
    with pytest.raises(ValueError, match=needle):
        make_args(**overrides)


def test_unknown_env_is_a_clear_error(tiny_model, tokenizer, make_args):
    with pytest.raises(ValueError, match="unknown env 'chess'.*registered envs"):
        AleaEnvGRPOTrainer(tiny_model(), args=make_args(envs=["kelly", "chess"]), processing_class=tokenizer)


def test_config_is_a_grpo_config():
    args = AleaEnvGRPOConfig(
        output_dir="x", max_steps=1, use_cpu=True, per_device_train_batch_size=3, num_generations=8, envs="hmm,nim"
    )
    assert isinstance(args, trl.GRPOConfig) and args.num_generations == 8 and args.envs == ["hmm", "nim"]


def test_extras_switch_on_a_built_model_without_them_is_an_error(tiny_model, tokenizer, make_args):
    with pytest.raises(ValueError, match="use_bigram"):
        AleaEnvGRPOTrainer(tiny_model(), args=make_args(envs=["kelly"], use_bigram=True), processing_class=tokenizer)
    with_extras = tiny_model(use_bigram=True)  # a model that has the table is accepted as is
    trainer = AleaEnvGRPOTrainer(
        with_extras, args=make_args(envs=["kelly"], use_bigram=True), processing_class=tokenizer
    )
    assert trainer.accelerator.unwrap_model(trainer.model).bigram is not None


def test_optimizer_groups_follow_trainer_weight_decay_convention(tiny_model, tokenizer, make_args):
    """Heads / backbone / extras keep their own learning rates, and weight decay reaches exactly the parameters
    ``Trainer.get_decay_parameter_names`` picks (no biases, no norm weights), as in ``Trainer.create_optimizer``."""
    model = tiny_model(use_aux_embed=True, use_bigram=True)
    args = make_args(envs=["kelly"], learning_rate=1e-3, lr_head=2e-3, lr_aux=3e-3, weight_decay=0.1)
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    optimizer = trainer.create_optimizer()
    names = {id(p): n for n, p in model.named_parameters()}
    decay = set(trainer.get_decay_parameter_names(model))
    seen = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            seen.add(name)
            assert group["weight_decay"] == (0.1 if name in decay else 0.0), name
            top = name.split(".")[0]
            expected_lr = 2e-3 if top.endswith("_head") else 1e-3 if top == "backbone" else 3e-3
            assert group["lr"] == expected_lr, name
    assert seen == {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n.split(".")[0] for n in seen} >= {"backbone", "choice_head", "aux_embed", "bigram"}
    norms = [n for n in seen if "norm" in n]
    assert norms and not set(norms) & decay  # the split is not vacuous: norm weights exist and are not decayed
    assert "choice_head.bias" in seen and "choice_head.bias" not in decay  # nor are biases
    assert any(n.startswith("backbone.") and n in decay for n in seen)
    # one AdamW step on zero gradients moves only the decayed parameters (decoupled decay: p -= lr * wd * p)
    before = _snapshot(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in model.named_parameters():
        moved = not torch.equal(p, before[name])
        assert moved == (name in decay and bool(before[name].abs().sum() > 0)), name
