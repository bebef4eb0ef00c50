"""Hostile user envs and numerical guards: fail fast with a ValueError that says where, or skip and count."""

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.questions import Decision, Question

from .toy_envs import NamedBestEnv


FAULTS = {
    "no_act": ("questions", lambda env: Decision(env.state_text(), [Question("x", "noul", "Q?")], env=env.name)),
    "zero_legal": ("options", lambda env: Decision(env.state_text(), [Question("act", "choice", "Q?", options=[])])),
    "nan_rewards": ("action_rewards", None),
    "nan_target": ("target", None),
    "wrong_shape_target": ("target", None),
    "observe_raises": ("observe", None),
    "step_raises": ("step", None),
}


class FaultyEnv(NamedBestEnv):
    """NamedBestEnv that misbehaves in one way at a fraction of its decisions."""

    name = "faulty"

    def __init__(self, fault: str, rate: float = 0.5):
        super().__init__()
        self.fault, self.rate = fault, rate

    def _reset(self, rng):
        super()._reset(rng)
        self.bad = bool(rng.random() < self.rate)

    def state_text(self):
        return f"The winning colour is {self.options[self.best]}."

    def _observe(self):
        if self.bad and self.fault == "observe_raises":
            raise KeyError("lost my state")
        builder = FAULTS[self.fault][1]
        if self.bad and builder is not None:
            return builder(self)
        return super()._observe()

    def action_rewards(self):
        r = super().action_rewards()
        return [float("nan")] + r[1:] if self.bad and self.fault == "nan_rewards" else r

    def oracle_targets(self):
        if self.bad and self.fault == "nan_target":
            return {"red": float("nan")}
        if self.bad and self.fault == "wrong_shape_target":
            return {"red": [0.5, 0.5]}
        return super().oracle_targets()

    def _step(self, action):
        if self.bad and self.fault == "step_raises":
            raise RuntimeError("the simulator crashed")
        return super()._step(action)


def _trainer(tiny_model, tokenizer, make_args, fault, **overrides):
    args = make_args(envs=["faulty", "kelly"], max_steps=3, eps_per_env=4, **overrides)
    return AleaEnvGRPOTrainer(
        tiny_model(), args=args, processing_class=tokenizer, env_factories={"faulty": lambda: FaultyEnv(fault)}
    )


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fail_fast_names_env_decision_and_field(tiny_model, tokenizer, make_args, fault):
    trainer = _trainer(tiny_model, tokenizer, make_args, fault)
    with pytest.raises(ValueError) as err:
        trainer.train()
    msg = str(err.value)
    assert "env 'faulty'" in msg and "decision" in msg and FAULTS[fault][0] in msg, msg


@pytest.mark.parametrize("fault", ["no_act", "nan_rewards", "step_raises", "observe_raises"])
def test_skip_mode_resets_counts_and_keeps_training(tiny_model, tokenizer, make_args, fault):
    trainer = _trainer(tiny_model, tokenizer, make_args, fault, on_env_error="skip")
    trainer.train()
    errors = [h["env_errors"] for h in trainer.state.log_history if "env_errors" in h]
    assert sum(errors) > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert "train_loss" in trainer.state.log_history[-1]


class LongStateEnv(NamedBestEnv):
    name = "long"

    def _observe(self):
        d = super()._observe()
        padding = " filler" * (2000 if self.best == 0 else 0)  # a quarter of the states are far too long
        return Decision(d.state + padding, d.questions, env=self.name)


@pytest.mark.parametrize("in_loss_forward", [True, False])
def test_oversize_states_reset_and_are_counted_never_truncated(tiny_model, tokenizer, make_args, in_loss_forward):
    args = make_args(envs=["long"], max_steps=3, max_len=256, sample_in_loss_forward=in_loss_forward)
    trainer = AleaEnvGRPOTrainer(
        tiny_model(), args=args, processing_class=tokenizer, env_factories={"long": LongStateEnv}
    )
    forwarded = []
    trainer.policy_forward.add_collate_hook(lambda packed, batch: forwarded.extend(len(p) for p in packed))
    trainer.train()  # the default on_env_error="raise" still resets oversize decisions (dropped, not an error)
    skipped = [h["skipped_decisions"] for h in trainer.state.log_history if "skipped_decisions" in h]
    assert sum(skipped) > 0
    assert forwarded and max(forwarded) <= 256


class ConstantEnv(NamedBestEnv):
    name = "constant"

    def action_rewards(self):
        return [0.5] * self.n_options


def test_all_equal_rewards_give_zero_policy_loss(tiny_model, tokenizer, make_args):
    args = make_args(envs=["constant"], max_steps=2, beta=0.0, report_w=0.0)
    trainer = AleaEnvGRPOTrainer(
        tiny_model(), args=args, processing_class=tokenizer, env_factories={"constant": ConstantEnv}
    )
    trainer.train()
    losses = [h["loss/policy"] for h in trainer.state.log_history if "loss/policy" in h]
    assert losses and all(v == 0.0 for v in losses)


def test_extreme_logits_stay_finite(tiny_model, tokenizer, make_args):
    model = tiny_model()
    with torch.no_grad():
        model.choice_head.weight.mul_(1e4)  # act logits in the thousands
    args = make_args(envs=["named_best"], max_steps=2, beta=0.1)
    trainer = AleaEnvGRPOTrainer(
        model, args=args, processing_class=tokenizer, env_factories={"named_best": NamedBestEnv}
    )
    trainer.train()
    assert all(np.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_non_finite_loss_stops_before_any_weight_changes(tiny_model, tokenizer, make_args, monkeypatch):
    import alea_trl.trainer.loss.objective as loss_module

    real = loss_module.report_losses
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the second step's report loss is NaN
            out["noul"] = [t * float("nan") for t in out["noul"]]
        return out

    monkeypatch.setattr(loss_module, "report_losses", poisoned)
    model = tiny_model()
    trainer = AleaEnvGRPOTrainer(model, args=make_args(envs=["kelly"], max_steps=3), processing_class=tokenizer)
    snapshots = []

    class Snap(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})

    trainer.add_callback(Snap())
    with pytest.raises(FloatingPointError, match=r"step 1: the loss/report term of the loss is nan"):
        trainer.train()
    assert len(snapshots) == 1  # one good step, then the stop
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, snapshots[0][name], atol=0, rtol=0, msg=name)
