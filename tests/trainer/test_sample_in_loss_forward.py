"""Sampling from the loss forward (``sample_in_loss_forward``, num_iterations == 1) against a separate rollout
forward: the same decisions, actions and update; one forward per micro-batch; outcome decisions trained once."""

import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer

from .conftest import TOY_FACTORIES


def _one_step(tiny_model, tokenizer, make_args, in_loss, **overrides):
    model = tiny_model()
    args = make_args(
        envs=["named_best"],
        max_steps=1,
        eps_per_env=8,
        max_batch=8,  # the separate rollout's wave = the micro-batch that samples in its loss forward: the same episodes and draws
        per_device_train_batch_size=8,
        sample_in_loss_forward=in_loss,
        optim="sgd",  # the update is proportional to the gradient (Adam would blow float noise up to a full step)
        max_grad_norm=0.0,
        **overrides,
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    trainer.train()
    return trainer, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode,beta", [("full", 0.0), ("tail", 0.1)])
def test_sampling_in_the_loss_forward_equals_a_separate_rollout_step(tiny_model, tokenizer, make_args, mode, beta):
    """A dense env at num_iterations == 1: sampling from the loss forward draws the same actions from the same
    logits as a no-grad rollout forward, so the first update is the same (tail mode: the reference shares the
    trunk inside the loss forward)."""
    kwargs = dict(train_mode=mode, tail_k=1, beta=beta)
    in_loss, p_in_loss = _one_step(tiny_model, tokenizer, make_args, True, **kwargs)
    separate, p_separate = _one_step(tiny_model, tokenizer, make_args, False, **kwargs)
    log_l, log_s = in_loss.state.log_history[0], separate.state.log_history[0]
    for key in ("loss/policy", "loss/report", "loss/kl", "env/named_best/entropy"):
        assert log_l[key] == pytest.approx(log_s[key], rel=1e-4, abs=1e-6), key
    assert log_l["clip_ratio"] == 0.0  # behaviour log-probs are the loss forward's own
    for name in p_in_loss:
        torch.testing.assert_close(p_in_loss[name], p_separate[name], atol=1e-6, rtol=1e-4, msg=name)


def _count_forwards(trainer):
    calls = []
    module = trainer.accelerator.unwrap_model(trainer.model)
    module.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(torch.is_grad_enabled()), with_kwargs=True)
    return calls


def test_sampling_in_the_loss_forward_runs_one_forward_per_micro_batch(tiny_model, tokenizer, make_args):
    for in_loss in (True, False):
        args = make_args(
            envs=["named_best", "three_in_a_row"],
            max_steps=4,
            beta=0.0,
            sample_in_loss_forward=in_loss,
            outcome_advantage="rtg",  # branching adds no-grad continuation forwards; counted in the test below
        )
        trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
        calls = _count_forwards(trainer)
        trainer.train()
        if in_loss:
            assert calls == [True] * 4  # the loss forwards, nothing else
        else:
            assert calls.count(True) == 4 and calls.count(False) >= 1  # plus no-grad rollout forwards


def test_outcome_decisions_train_each_term_once(tiny_model, tokenizer, make_args):
    """An outcome decision enters the KL / report terms when it is made and the policy term once, when its episode
    ends; dense decisions enter both at once."""
    import alea_trl.trainer.grpo_trainer as gt

    seen = []
    original = gt.sampled_forward_inputs

    def spy(replay, wave, rows, k, env_index):
        inputs = original(replay, wave, rows, k, env_index)
        seen.append((replay, wave, rows, inputs))
        return inputs

    gt.sampled_forward_inputs = spy
    try:
        args = make_args(envs=["three_in_a_row", "named_best"], max_steps=12, beta=0.0, outcome_advantage="rtg")
        trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
        trainer.train()
    finally:
        gt.sampled_forward_inputs = original
    made, replayed = {}, {}
    for replay, wave, rows, inputs in seen:
        n_replay = len(replay)
        for i, row in enumerate(replay):
            assert (
                bool(inputs["sample_mask"][i, 0]) and inputs["kl_report_mask"][i] == 0 and inputs["targets"][i] == {}
            )
            replayed[id(row)] = replayed.get(id(row), 0) + 1
        for j, (ep, row) in enumerate(zip(wave.episodes, rows)):
            i = n_replay + j
            assert row is not None and inputs["kl_report_mask"][i] == 1 and inputs["targets"][i] == row.targets
            if ep.env.dense:
                assert int(inputs["sample_mask"][i].sum()) == len(row.actions) == args.num_generations
            else:
                assert not inputs["sample_mask"][i].any()  # its action waits for the return
                made[id(row)] = row
    assert replayed and set(replayed) <= set(made)
    assert all(count == 1 for count in replayed.values())
