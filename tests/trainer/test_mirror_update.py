"""The step-target updates of dense decisions (alea_trl/trainer/loss/dense.py: ``mirror``, the natural-gradient step,
and ``all_actions_ascent``, the all-actions step made an ascent) are steps on GRPO's objective over the legal
actions: checked on tabular logits (one logit per action, the act head's last layer) against autograd and closed
forms, each property for both rules."""

import functools
import math
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.trainer import grpo_trainer
from alea_trl.trainer.loss.dense import STEP_TARGET_UPDATES, all_actions_loss, step_target_loss
from alea_trl.trainer.outputs.model_card import _update_sentence
from alea_trl.trainer.rollout.advantages import (
    ASCENT_MAX_STEP,
    ASCENT_MIN_COSINE,
    STEP_RULES,
    regularised_advantages,
    step_targets,
)

from .conftest import TOY_FACTORIES


def _steps(rule, rewards, legal, old_logp, scale, beta=0.0, ref_logp=None):
    """``rule``'s steps from the rewards (the rollout's two calls)."""
    return step_targets(rule, *regularised_advantages(rewards, legal, old_logp, scale, beta, ref_logp), legal)


RULES = {rule: functools.partial(_steps, rule) for rule in ("mirror", "all_actions_ascent")}
rules = pytest.mark.parametrize("rule", list(RULES))


def test_every_step_target_update_has_a_rule_and_an_unknown_one_is_refused():
    assert set(STEP_RULES) == set(STEP_TARGET_UPDATES)
    legal = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="field 'update'"):
        step_targets("all_actions", torch.full((1, 2), 0.5), torch.zeros(1, 2), legal)


def _objective(z, q, beta, ref_logp, scale):
    """J(pi) = E_pi[Q] / s - beta KL(pi || pi_ref) of the softmax of logits z."""
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    return (p * q).sum(-1) / scale[:, 0] - beta * (p * (logp - ref_logp)).sum(-1)


def _loss_gradient(z, q, beta, ref_logp, scale, rule="mirror"):
    """The logit gradient of the step-target loss of ``rule`` at the behaviour policy, the loss value and the steps."""
    z = z.clone().requires_grad_(True)
    legal = torch.ones_like(z, dtype=torch.bool)
    logp = torch.log_softmax(z, -1)
    steps = RULES[rule](q, legal, logp.detach(), scale, beta, ref_logp)
    loss, _ = step_target_loss(logp, logp.detach(), steps, legal, torch.ones(len(z), dtype=torch.bool))
    (grad,) = torch.autograd.grad(loss, z)
    return grad, loss.item(), steps


@rules
def test_every_step_ascends_the_regularised_objective(rule):
    """On 5,000 random decisions (2-40 actions, probabilities down to 1e-9, beta 0-1) the descent direction of the
    loss has a positive inner product with the gradient of E[Q]/s - beta KL(pi || pi_ref) (all_actions_ascent: a
    cosine of at least ASCENT_MIN_COSINE)."""
    torch.manual_seed(0)
    worst = math.inf
    for _ in range(5000):
        n = int(torch.randint(2, 41, ()))
        z = torch.randn(1, n) * float(torch.empty(()).uniform_(0.1, 6.0))
        q = torch.rand(1, n)
        beta = float(torch.empty(()).uniform_(0.0, 1.0)) if torch.rand(()) < 0.7 else 0.0
        ref_logp = torch.log_softmax(torch.randn(1, n), -1)
        scale = torch.full((1, 1), float(torch.empty(()).uniform_(0.1, 2.0)))
        grad, _, _ = _loss_gradient(z, q, beta, ref_logp, scale, rule)
        zz = z.double().requires_grad_(True)  # float64: p A can be 1e-6 long, float32's error is 1e-7
        (ascent,) = torch.autograd.grad(_objective(zz, q.double(), beta, ref_logp.double(), scale.double()).sum(), zz)
        ascent = ascent.float()
        inner = (-grad * ascent).sum().item()
        cosine = inner / (grad.norm() * ascent.norm()).clamp(min=1e-30).item()
        worst = min(worst, cosine)
    assert worst > 0.0  # the all-actions update went down to -0.71 here
    if rule == "all_actions_ascent":
        assert worst >= ASCENT_MIN_COSINE - 1e-3, worst


@rules
@pytest.mark.parametrize("beta", [0.2, 0.5, 1.0])
def test_the_fixed_point_is_the_regularised_optimum(beta, rule):
    """Iterated on one decision, the policy settles at pi*(a) ~ pi_ref(a) exp(Q(a) / beta) (uniform reference)."""
    q = torch.tensor([[1.0, 0.8, 0.5, 0.0]])
    ref_logp = torch.log_softmax(torch.zeros(1, 4), -1)
    scale = torch.ones(1, 1)
    z = torch.zeros(1, 4)
    for _ in range(3000):
        grad, _, _ = _loss_gradient(z, q, beta, ref_logp, scale, rule)
        z = z - 2.0 * grad
    expected = torch.softmax(q / beta, -1)
    torch.testing.assert_close(torch.softmax(z, -1), expected, atol=1e-4, rtol=0)


@rules
def test_without_a_reference_it_goes_greedy_and_ruled_out_logits_stay_bounded(rule):
    """At beta = 0 the policy goes greedy; a worse action's push fades once it is rarer than under uniform play, so
    the ruled-out actions' logits stop falling (without the fade they fall by |A| / sqrt(n) a step, without end)."""
    q = torch.tensor([[1.0, 0.8, 0.5, 0.0]])
    z = torch.zeros(1, 4)
    for _ in range(3000):
        grad, _, _ = _loss_gradient(z, q, 0.0, None, torch.ones(1, 1), rule)
        z = z - 2.0 * grad
    assert torch.softmax(z, -1)[0, 0] > 0.97
    centred = z - z.mean()
    assert centred.min() > -30.0, centred  # without the fade: -1725 here


@rules
def test_step_size_does_not_grow_with_the_number_of_actions(rule):
    """Mean logit-gradient norm at 2 ... 80 legal actions (rewards scaled by their std, as scale_rewards="group"): on
    every decision at most the rule's cap (mirror: the largest advantage; all_actions_ascent: ASCENT_MAX_STEP times
    it), and not vanishing (the expected sampled gradient fell from 0.37 to 0.22). mirror: flat from 5 to 80 actions
    and at most 1.5x its size at 2. all_actions_ascent keeps the all-actions step's growth up to its cap and then
    stops: flat from 40 to 80 actions, at most 3.2x its size at 2 (the all-actions update grew 6x from 2 to 40
    actions here, 8.4x to 80, and on)."""
    torch.manual_seed(1)
    means = []
    for n in (2, 5, 10, 20, 40, 80):
        norms = []
        for _ in range(300):
            z, q = torch.randn(1, n), torch.rand(1, n)
            scale = q.std(-1, keepdim=True) + 1e-4
            grad, value, steps = _loss_gradient(z, q, 0.0, None, scale, rule)
            adv = q / scale - (torch.softmax(z, -1) * q / scale).sum()
            # the cap (mirror: max |A|, all_actions_ascent: ASCENT_MAX_STEP max |A|) is float64, the gradient float32
            bound = adv.abs().max().item() * (1.0 if rule == "mirror" else ASCENT_MAX_STEP) * (1 + 1e-4)
            assert grad.norm() <= bound and value <= bound**2 / 2
            norms.append(grad.norm().item())
        means.append(sum(norms) / len(norms))
    if rule == "mirror":
        assert max(means) <= 1.5 * means[0] and max(means[1:]) <= 1.15 * min(means[1:]), means
    else:
        assert max(means) <= 3.2 * means[0] and means[5] <= 1.05 * means[4], means
    assert means[-1] >= means[0] / 3, means  # not vanishing


def test_a_two_action_decision_keeps_the_all_actions_step_whole():
    """Over 2,000 random two-action decisions (logits 6 x a standard normal, so probabilities from near 0 to near 1;
    rewards scaled by their std): all_actions_ascent's step equals the logit step of ``dense_update="all_actions"``
    (minus the gradient of its loss, times the rows). Neither the ascent lift nor the size cap touches a two-action
    decision, so an env of two-way choices (hmm) trains at the all-actions update's pace (a cap of ``max |A|`` would
    shorten such a step to as little as 1/sqrt(2) of its length)."""
    torch.manual_seed(3)
    n = 2000
    z = (torch.randn(n, 2, dtype=torch.float64) * 6.0).requires_grad_()
    q = torch.rand(n, 2, dtype=torch.float64)
    legal = torch.ones(n, 2, dtype=torch.bool)
    scale = q.std(-1, keepdim=True) + 1e-4
    logp = torch.log_softmax(z, -1)
    p, adv = regularised_advantages(q, legal, logp.detach(), scale)
    loss, _, _ = all_actions_loss(logp, logp.detach(), adv, legal, torch.ones(n, dtype=torch.bool), 0.2, 0.2)
    loss.backward()
    all_actions = -z.grad * n
    step = step_targets("all_actions_ascent", p, adv, legal)
    assert torch.allclose(step.double(), all_actions, atol=1e-6), (step.double() - all_actions).abs().max()
    # some of these steps are longer than max |A|, so a cap of max |A| would shorten them
    longer = all_actions.norm(dim=-1) > adv.abs().amax(-1) * 1.05
    assert longer.sum() > n // 10, longer.sum()


@rules
def test_an_improbable_best_action_is_still_learnt(rule):
    """p(best) = 1e-6 under a confident mode: the mirror update makes the best action the most probable; the
    expected sampled gradient (pi * A) at the same learning rate has not moved it."""
    q = torch.tensor([[1.0, 0.6, 0.0, 0.0, 0.0]])
    z0 = torch.tensor([[0.0, 14.0, 0.0, 0.0, 0.0]])
    z0[0, 0] = 14.0 + math.log(1e-6)  # best action at about 1e-6
    assert torch.softmax(z0, -1)[0, 0] < 2e-6
    z, sampled = z0.clone(), z0.clone()
    for _ in range(400):
        grad, _, _ = _loss_gradient(z, q, 0.0, None, torch.ones(1, 1), rule)
        z = z - 1.0 * grad
        p = torch.softmax(sampled, -1)
        sampled = sampled + 1.0 * p * (q - (p * q).sum())  # expected sampled policy gradient step
    assert torch.softmax(z, -1)[0].argmax() == 0
    assert torch.softmax(sampled, -1)[0, 0] < 1e-4


@rules
def test_the_loss_is_zero_at_its_target_and_illegal_actions_take_no_part(rule):
    legal = torch.tensor([[True, True, True, False]])
    q = torch.tensor([[0.0, 1.0, 0.5, 9.0]])
    old = torch.log_softmax(torch.tensor([[0.3, -0.2, 0.1, -1e9]]), -1).masked_fill(~legal, 0.0)
    steps = RULES[rule](q, legal, old, torch.ones(1, 1))
    assert steps[0, 3] == 0 and abs(steps[0, :3].sum().item()) < 1e-6
    target = torch.log_softmax(old.masked_fill(~legal, -1e9) + steps.masked_fill(~legal, -1e9), -1)
    loss, _ = step_target_loss(target, old, steps, legal, torch.ones(1, dtype=torch.bool))
    assert loss.item() < 1e-10
    with pytest.raises(ValueError, match="ref_logp"):
        RULES[rule](q, legal, old, torch.ones(1, 1), beta=0.1)


@pytest.mark.parametrize(
    "rule, says",
    [
        ("mirror", "toward the mirror-descent target"),
        ("all_actions_ascent", "toward the all-actions step made an ascent"),
    ],
)
def test_the_trainer_trains_dense_rows_by_their_steps_and_names_the_update(
    tiny_model, tokenizer, make_args, rule, says
):
    """The trainer's plumbing: dense rows carry centred steps over their legal actions, the loss is told the update,
    and the model card names it (learning with it: test_all_actions.test_learns_dense_env_by_every_legal_action)."""
    seen = []
    real = grpo_trainer.grpo_loss

    def spy(output, batch, inputs, settings, **kwargs):
        seen.append((inputs["all_actions_rows"].clone(), inputs["action_advantages"].clone(), settings.dense_update))
        return real(output, batch, inputs, settings, **kwargs)

    args = make_args(envs=["named_best"], max_steps=2, beta=0.01, dense_update=rule)  # KL folded into the steps
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    with mock.patch.object(grpo_trainer, "grpo_loss", spy):
        trainer.train()
    rows, steps, update = seen[0]
    assert update == rule and bool(rows.all())
    assert steps[rows].abs().sum() > 0  # NamedBest: one option of 4 is worth 1, the others 0
    assert torch.allclose(steps[rows].sum(-1), torch.zeros(int(rows.sum())), atol=1e-5)  # centred over 4 options
    assert says in _update_sentence(SimpleNamespace(dense_update=rule), "rtg")


def test_steps_narrower_than_the_batch_are_zero_padded():
    """A forward's act width is its widest decision's (a replayed outcome row may have more options than any dense
    row); the steps and behaviour log-probs of the dense rows are zero-padded to it."""
    legal = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    logp = torch.log_softmax(torch.randn(2, 5).masked_fill(~legal, -1e9), -1).masked_fill(~legal, 0.0)
    old = torch.log_softmax(torch.randn(2, 3), -1)
    steps = _steps(
        "mirror", torch.tensor([[0.0, 1.0, 0.5]]), torch.ones(1, 3, dtype=torch.bool), old[:1], torch.ones(1, 1)
    )
    steps = torch.cat([steps, torch.zeros(1, 3)])
    rows = torch.tensor([True, False])
    narrow, _ = step_target_loss(logp, old, steps, legal, rows)
    wide, _ = step_target_loss(
        logp, torch.nn.functional.pad(old, (0, 2)), torch.nn.functional.pad(steps, (0, 2)), legal, rows
    )
    assert narrow.item() == pytest.approx(wide.item()) and narrow.item() > 0


def test_it_trains_beside_replayed_outcome_decisions(tiny_model, tokenizer, make_args):
    """Under reward-to-go, nim's decisions (up to 21 options) are replayed in the forwards of kelly's dense ones."""
    args = make_args(envs=["kelly", "nim"], max_steps=4, beta=0.05, dense_update="mirror", outcome_advantage="rtg")
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 4
