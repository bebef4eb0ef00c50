"""dense_update="all_actions": every legal action's advantage, a logit-space step that does not shrink with an
action's probability, PPO's clip per action, and the trainer's plumbing and learning with it."""

from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.trainer import grpo_trainer
from alea_trl.trainer.loss.dense import all_actions_loss, step_target_loss
from alea_trl.trainer.outputs.model_card import _update_sentence
from alea_trl.trainer.rollout.advantages import all_action_advantages

from .conftest import TOY_FACTORIES
from .test_trainer import _expected_reward


def _legal(widths, width):
    return torch.arange(width)[None, :] < torch.tensor(widths)[:, None]


def test_advantages_are_against_the_policys_expected_reward_and_scaled():
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [3.0, 1.0, 99.0, 99.0], [0.5, 0.5, 0.5, 0.0], [7.0, 0.0, 0.0, 0.0]])
    legal = _legal([4, 2, 3, 1], 4)
    uniform = torch.log_softmax(torch.zeros(4, 4).masked_fill(~legal, float("-inf")), -1)
    envs = torch.zeros(4, dtype=torch.long)
    adv = all_action_advantages(q, legal, uniform, "group", envs)
    assert torch.all(adv[~legal] == 0)
    assert torch.allclose(adv[0], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-3)  # (Q - 0.25) / std 0.5
    assert torch.allclose(adv[1, :2], torch.tensor([0.7071, -0.7071]), atol=1e-3)  # the illegal 99s play no part
    assert torch.all(adv[2:] == 0)  # all legal actions worth the same; a single legal action
    # the baseline is the behaviour policy's expected reward: a policy on option 1 makes option 0 the only gain
    sure = torch.log(torch.tensor([[1e-9, 1.0, 1e-9, 1e-9]]))
    adv = all_action_advantages(q[:1], legal[:1], sure, "none", envs[:1])
    assert torch.allclose(adv, torch.tensor([[1.0, 0.0, 0.0, 0.0]]), atol=1e-6)
    two_envs = torch.tensor([0, 0, 1, 1])
    batch = all_action_advantages(q, legal, uniform, "batch", two_envs)
    std0 = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0]).std()  # env 0's legal values
    assert torch.allclose(batch[1, :2], torch.tensor([1.0, -1.0]) / (std0 + 1e-4))


def _loss_grad(logits, legal, adv, old=None, temperature=1.0):
    logits = logits.clone().requires_grad_()
    logp = torch.log_softmax(logits.masked_fill(~legal, float("-inf")) / temperature, -1)
    old = logp.detach() if old is None else old
    pad = torch.nn.functional.pad  # the loss inputs of a batch may be wider than this forward's options
    loss, n_clipped, kl = all_actions_loss(logp, pad(old, (0, 2)), pad(adv, (0, 2)), legal, legal.any(-1), 0.2, 0.2)
    grad = torch.autograd.grad(loss, logits)[0] if loss.requires_grad else torch.zeros_like(logits)
    return loss, grad, n_clipped, kl, logp.detach()


def test_a_better_action_gets_its_step_whatever_its_probability():
    temperature = 2.0
    logits = torch.tensor([[-30.0, 2.0, 1.0, 0.0], [0.0, 1.0, -1e9, -1e9]])
    legal = _legal([4, 2], 4)
    q = torch.tensor([[1.0, 0.2, 0.1, 0.0], [0.0, 1.0, 0.0, 0.0]])
    logp = torch.log_softmax(logits.masked_fill(~legal, float("-inf")) / temperature, -1)
    assert logp[0, 0].exp() < 1e-6  # the best action is all but impossible
    adv = all_action_advantages(q, legal, logp, "group", torch.zeros(2, dtype=torch.long))
    assert adv[0, 0] > 1.0
    loss, grad, n_clipped, kl, _ = _loss_grad(logits, legal, adv, temperature=temperature)
    # its logit moves by A (1 - p) / temperature, over the two decisions' mean: the full step
    assert torch.allclose(grad[0, 0], -adv[0, 0] / temperature / 2, rtol=1e-4)
    assert n_clipped == 0 and abs(float(kl)) < 1e-6
    # the sampled policy gradient's expectation, sum_a p(a) A(a) grad log p(a), barely moves it
    sampled = logits.clone().requires_grad_()
    p = torch.softmax(sampled.masked_fill(~legal, float("-inf")) / temperature, -1)
    (-(p * adv).sum() / 2).backward()
    assert sampled.grad[0, 0].abs() < 1e-5 * grad[0, 0].abs()


def test_the_update_fades_at_the_optimum_and_the_loss_is_bounded():
    legal = torch.ones(1, 3, dtype=torch.bool)
    q = torch.tensor([[1.0, 0.5, 0.0]])
    for gap in (5.0, 10.0, 20.0):  # the best action ever more certain
        logits = torch.tensor([[gap, 0.0, 0.0]])
        logp = torch.log_softmax(logits, -1)
        adv = all_action_advantages(q, legal, logp, "group", torch.zeros(1, dtype=torch.long))
        loss, grad, *_ = _loss_grad(logits, legal, adv)
        assert grad.abs().max() < 10 * torch.exp(torch.tensor(-gap))  # no push on the ruled-out actions
        assert loss.abs() < 2.0


def test_a_dense_decision_weighs_one_row_of_its_micro_batch_whatever_the_other_rows_are():
    """Row 0's all-actions step is divided by the micro-batch's rows, not by its dense rows: it is the same whether
    the other rows are all-actions decisions too or decisions of another kind (outcome rows, trained by their
    samples), and the mirror update's is too."""
    g = torch.Generator().manual_seed(3)
    legal = torch.ones(4, 5, dtype=torch.bool)
    logits = torch.randn(4, 5, generator=g).requires_grad_()
    logp = torch.log_softmax(logits, -1)
    adv = all_action_advantages(torch.rand(4, 5, generator=g), legal, logp.detach(), "group", torch.zeros(4).long())
    grads = []
    for rows in ([True, True, True, True], [True, False, False, False], [True, False, True, False]):
        rows = torch.tensor(rows)
        for loss in (
            all_actions_loss(logp, logp.detach(), adv, legal, rows, 0.2, 0.2)[0],
            step_target_loss(logp, logp.detach(), adv, legal, rows)[0],
        ):
            grads.append(torch.autograd.grad(loss, logits, retain_graph=True)[0][0])
    for i, grad in enumerate(grads):
        torch.testing.assert_close(grad, grads[i % 2])
    assert grads[0].abs().max() > 0.05 and grads[1].abs().max() > 0.05


def test_the_clip_stops_only_moves_past_the_ratio_range_and_the_kl_is_exact():
    legal = torch.ones(1, 3, dtype=torch.bool)
    old = torch.log_softmax(torch.zeros(1, 3), -1)
    logits = torch.tensor([[2.0, 0.0, 0.0]])  # ratios to the uniform behaviour policy: 2.36, 0.32, 0.32
    for adv, clipped in ((torch.tensor([[1.0, -0.5, -0.5]]), 3), (torch.tensor([[-1.0, 0.5, 0.5]]), 0)):
        loss, grad, n_clipped, kl, logp = _loss_grad(logits, legal, adv, old=old)
        assert n_clipped == clipped
        if clipped == 3:  # each action already moved past 1 +- 0.2 in its advantage's direction: no gradient
            assert grad.abs().max() == 0
        else:  # moving back towards the behaviour policy is never clipped
            p = logp.exp()[0]
            expected = -(
                -1.0 * p[0] * (torch.eye(3)[0] - p) + 0.5 * (torch.eye(3)[1] - p) + 0.5 * (torch.eye(3)[2] - p)
            )
            assert torch.allclose(grad[0], expected, atol=1e-6)
        assert torch.allclose(kl, (old.exp() * (old - logp)).sum())


def test_every_dense_row_trains_by_all_its_actions(tiny_model, tokenizer, make_args):
    seen = []
    real = grpo_trainer.grpo_loss

    def spy(output, batch, inputs, settings, **kwargs):
        seen.append({k: inputs[k].clone() for k in ("all_actions_rows", "action_advantages", "outcome_rows")})
        seen[-1]["trains"] = inputs["sample_mask"].any(-1).clone()
        return real(output, batch, inputs, settings, **kwargs)

    args = make_args(envs=["named_best", "three_in_a_row"], max_steps=3, dense_update="all_actions")
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    with mock.patch.object(grpo_trainer, "grpo_loss", spy):
        trainer.train()
    dense_rows = 0
    for inputs in seen:
        dense = ~inputs["outcome_rows"] & inputs["trains"]
        assert torch.equal(inputs["all_actions_rows"], dense)  # dense rows: all actions; outcome rows: samples
        for adv in inputs["action_advantages"][dense]:
            # NamedBestEnv: reward 1 for the named option of 4, else 0 (std 0.5): one action 1 / 0.5 above the others
            low, high = adv.sort().values[:3], adv.max()
            assert high > 0 > low.max() and torch.allclose(low, low[:1].expand(3))
            assert torch.allclose(high - low[0], torch.tensor(2.0), atol=1e-3)
            dense_rows += 1
    assert dense_rows > 0 and any(bool(i["outcome_rows"].any()) for i in seen)
    trainer.create_model_card()  # the card says how dense decisions trained
    text = (Path(args.output_dir) / "README.md").read_text()
    assert "every legal action's exact expected reward" in text and "dense decisions are GRPO groups" not in text


@pytest.mark.parametrize(
    "dense_update, scale_rewards",
    [("all_actions", "group"), ("all_actions", "none"), ("mirror", "group"), ("all_actions_ascent", "group")],
)
def test_learns_dense_env_by_every_legal_action(tiny_model, tokenizer, make_args, dense_update, scale_rewards):
    model = tiny_model()
    start = _expected_reward(model, tokenizer)
    args = make_args(
        envs=["named_best"],
        max_steps=60,
        eps_per_env=16,
        max_batch=16,
        per_device_train_batch_size=16,
        num_generations=8,
        beta=0.0,
        dense_update=dense_update,
        scale_rewards=scale_rewards,
    )
    AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES).train()
    assert start < 0.35 and _expected_reward(model, tokenizer) >= 0.9
    assert np.isfinite(start)


@pytest.mark.parametrize(
    "dense_update, outcome, says",
    [
        ("all_actions", "branch", "outcome decisions are GRPO groups of 8 (nim: 16) actions valued by Monte Carlo"),
        ("all_actions_ascent", "branch", 'made an ascent of E[Q] - beta KL (`dense_update="all_actions_ascent"`)'),
        ("all_actions", "rtg", "outcome decisions are valued by their reward-to-go"),
        ("sampled", "rtg", "dense decisions are GRPO groups of 8 (nim: 16) actions scored by their exact expected"),
    ],
)
def test_model_card_names_the_update_and_only_the_groups_it_samples(dense_update, outcome, says):
    args = SimpleNamespace(dense_update=dense_update, num_generations=8, num_generations_per_env={"nim": 16})
    text = _update_sentence(args, outcome)
    assert says in text
    assert ("every legal action" in text) == (dense_update != "sampled")
