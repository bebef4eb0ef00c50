"""The GRPO loss terms on hand-built tensors."""

import numpy as np
import pytest
import torch

from alea_trl.trainer.loss import exact_kl, policy_loss
from alea_trl.trainer.loss.policy import PolicyObjective
from alea_trl.trainer.rollout.advantages import env_batch_std, group_advantages, outcome_advantage


def test_policy_gradient_equals_group_baseline_reinforce_at_ratio_one():
    g = torch.Generator().manual_seed(0)
    n, k = 5, 8
    z = torch.randn(n, generator=g, requires_grad=True)
    logp_all = torch.log_softmax(z, -1)
    actions = torch.randint(n, (k,), generator=g)
    rewards = torch.rand(n, generator=g)[actions]
    adv = group_advantages(rewards, "group")
    logp = logp_all[actions][None]  # (1, k)
    loss, stats = policy_loss(logp, logp.detach(), adv[None], torch.ones(1, k, dtype=torch.bool), 0.2, 0.2)
    loss.backward()
    p = logp_all.exp().detach()
    by_hand = -sum(adv[j] * (torch.nn.functional.one_hot(actions[j], n).float() - p) for j in range(k)) / k
    torch.testing.assert_close(z.grad, by_hand)
    assert stats.clip_ratio == 0 and stats.approx_kl == 0
    # the baseline: advantages are centred and scaled within the group
    torch.testing.assert_close(adv.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, (rewards - rewards.mean()) / (rewards.std() + 1e-4))


def test_clipping_engages_outside_the_trust_region():
    eps_low, eps_high = 0.2, 0.3
    old = torch.zeros(1, 4)
    # ratios 1.5 (adv +), 0.5 (adv -), 1.1 (adv +), 0.5 (adv +)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 4, dtype=torch.bool), eps_low, eps_high)
    loss.backward()
    grad = logp.grad[0]
    assert grad[0] == 0 and grad[1] == 0  # clipped: above 1 + eps_high with A > 0, below 1 - eps_low with A < 0
    assert grad[2] != 0 and grad[3] != 0  # inside the region, or clipping would not lower the objective
    assert stats.clip_ratio == 0.5
    torch.testing.assert_close(grad[2], torch.tensor(-1.1 / 4))  # d(-A r)/dlogp = -A r / count


def test_masked_samples_do_not_count():
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([[2.0, 100.0]]), torch.tensor([[True, False]]), 0.2, 0.2)
    loss.backward()
    assert logp.grad[0, 1] == 0
    torch.testing.assert_close(loss, torch.tensor(-2.0))


def _row_grads(logp0, adv, mask, outcome, weight=1.0, loss_type="grpo"):
    """The gradient of :func:`policy_loss` on each sampled log-prob, `(N, k)`."""
    logp = logp0.clone().requires_grad_(True)
    loss, _ = policy_loss(
        logp, logp0, adv, mask, 0.2, 0.2, outcome_rows=outcome, outcome_weight=weight,
        objective=PolicyObjective(loss_type=loss_type),
    )  # fmt: skip
    loss.backward()
    return logp.grad


@pytest.mark.parametrize("loss_type", ["grpo", "sapo", "luspo", "dr_grpo"])
def test_a_decision_weighs_the_same_whatever_shares_its_micro_batch(loss_type):
    """Row 0's pull does not depend on the kind, the number of samples or the order of the other rows of its
    micro-batch (rows of the same count): one decision, one weight."""
    g = torch.Generator().manual_seed(1)
    k, n = 4, 6
    logp0 = torch.log(torch.rand(n, k, generator=g) * 0.8 + 0.1)
    adv = torch.randn(n, k, generator=g)
    mask = torch.ones(n, k, dtype=torch.bool)
    base = _row_grads(logp0, adv, mask, torch.zeros(n, dtype=torch.bool), loss_type=loss_type)[0]
    assert base.abs().min() > 0
    for seed in range(5):
        mates = torch.Generator().manual_seed(100 + seed)
        outcome = torch.rand(n, generator=mates) < 0.5
        outcome[0] = False
        mixed = mask.clone()
        mixed[1:, 1:] &= outcome[1:, None].logical_not()  # the outcome mates: one replayed action each
        order = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(n - 1, generator=mates)])
        grads = _row_grads(logp0[order], adv[order], mixed[order], outcome[order], loss_type=loss_type)
        torch.testing.assert_close(grads[0], base)


def test_a_dense_and_an_outcome_decision_of_equal_advantages_pull_equally_at_weight_one():
    """A dense decision's k samples of one action with advantage A, and an outcome decision's one replayed sample of
    that action with advantage A (or k branched samples): the same step on that action's log-prob at
    ``outcome_loss_weight`` 1, and ``w`` times it at weight ``w``."""
    k = 8
    logp0 = torch.log(torch.full((3, k), 0.25))
    adv = torch.full((3, k), 0.7)
    mask = torch.ones(3, k, dtype=torch.bool)
    mask[1, 1:] = False  # row 1: an outcome decision replayed with its one action; row 2: a branched one (k)
    outcome = torch.tensor([False, True, True])
    grads = _row_grads(logp0, adv, mask, outcome)
    dense_pull, replayed_pull, branched_pull = grads[0].sum(), grads[1].sum(), grads[2].sum()
    torch.testing.assert_close(replayed_pull, dense_pull)
    torch.testing.assert_close(branched_pull, dense_pull)
    torch.testing.assert_close(dense_pull, torch.tensor(-0.7 / 3))  # -A / N: each of the 3 decisions weighs 1/3
    heavier = _row_grads(logp0, adv, mask, outcome, weight=2.5)
    torch.testing.assert_close(heavier[1].sum(), 2.5 * dense_pull)
    torch.testing.assert_close(heavier[0].sum(), dense_pull)  # the dense decision's pull is unchanged


def test_delta_bounds_the_loss_of_a_negative_advantage_with_a_large_ratio():
    """TRL's two-sided clip: with A < 0 the unclipped term -A r grows with r; ``delta`` caps r there."""
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[5.0, 5.0]])).requires_grad_(True)  # ratio 5, a stale replay
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    unbounded, _ = policy_loss(logp, old, adv, mask, 0.2, 0.2)
    bounded, _ = policy_loss(logp, old, adv, mask, 0.2, 0.2, delta=2.0)
    torch.testing.assert_close(unbounded, torch.tensor((5.0 - 1.2) / 2))  # -A r for A < 0, clipped 1.2 for A > 0
    torch.testing.assert_close(bounded, torch.tensor((2.0 - 1.2) / 2))
    bounded.backward()
    assert logp.grad[0, 0] == 0  # capped: no gradient pushing the ratio further


def test_approx_kl_matches_the_exact_kl_of_a_small_change():
    """``approx_kl`` averages (r - 1) - log r over the samples, an unbiased estimate of KL(old || new) when the
    samples are drawn from the old policy."""
    g = torch.Generator().manual_seed(1)
    old_p = torch.softmax(torch.randn(5, generator=g), -1)
    new_p = torch.softmax(torch.log(old_p) + 0.1 * torch.randn(5, generator=g), -1)
    actions = torch.multinomial(old_p, 200_000, replacement=True, generator=g)[None]
    logp, old = torch.log(new_p)[actions], torch.log(old_p)[actions]
    _, stats = policy_loss(logp, old, torch.zeros_like(logp), torch.ones_like(logp, dtype=torch.bool), 0.2, 0.2)
    exact = (old_p * (torch.log(old_p) - torch.log(new_p))).sum()
    torch.testing.assert_close(stats.approx_kl, exact, rtol=0.05, atol=1e-5)


def test_all_equal_rewards_give_zero_advantage():
    for scale in ("group", "batch", "none"):
        adv = group_advantages(torch.full((8,), 0.7), scale, batch_std=0.0)
        assert torch.isfinite(adv).all() and torch.all(adv == 0)


def test_exact_kl_by_hand_and_zero_against_itself():
    logits = torch.tensor([[1.0, 2.0, 0.5, float("-inf")], [0.3, -1.0, float("-inf"), float("-inf")]])
    ref_logits = torch.tensor([[0.0, 0.0, 0.0, float("-inf")], [1.0, 0.0, float("-inf"), float("-inf")]])
    legal = torch.isfinite(logits)
    logp, ref = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    kl = exact_kl(logp, ref, legal)
    for i in range(2):
        n = int(legal[i].sum())
        p, q = logp[i, :n].exp(), ref[i, :n].exp()
        torch.testing.assert_close(kl[i], (p * (p.log() - q.log())).sum())
    torch.testing.assert_close(exact_kl(logp, logp, legal), torch.zeros(2))
    assert (kl > 0).all()


def test_batched_report_losses_equal_one_call_per_question(tokenizer):
    """Report questions scored in one call per (qtype, shape) give each question the loss of its own call, on the
    five built-in envs' real targets (indices, distributions, probabilities, samples)."""
    import numpy as np

    from alea_trl import AleaModel
    from alea_trl.collate import collate_segments
    from alea_trl.envs import make_env
    from alea_trl.losses import bernoulli_brier, choice_loss, crps_loss, pinball_loss
    from alea_trl.packing import pack_request
    from alea_trl.questions import ACT_QID, validate_targets
    from alea_trl.testing import tiny_backbone_config
    from alea_trl.trainer.loss import report_losses

    torch.manual_seed(0)
    config = tiny_backbone_config("qwen3", vocab_size=len(tokenizer), num_layers=1)
    model = AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32})
    rng = np.random.default_rng(0)
    packed, targets = [], []
    for name in ["hmm", "kelly", "newsvendor", "bandit", "nim"]:
        env = make_env(name).reset(rng)
        for _ in range(3):
            d = env.observe()
            packed.append(pack_request(tokenizer, d.state, d.questions))
            targets.append(validate_targets(d, env.oracle_targets(), env=name))
            if env.step(0)[1]:
                env.reset(rng)
    batch = collate_segments(packed, tokenizer.pad_token_id)
    out = model(**batch.model_inputs())
    taus = list(model.config.taus)
    got = report_losses(out, batch, targets, taus)
    expected = {q: [] for q in got}
    flat = 0
    for questions, tgt in zip(batch.questions, targets):
        for q in questions:
            if q.qid != ACT_QID and q.qid in tgt:
                t, i = tgt[q.qid], slice(flat, flat + 1)
                if q.qtype == "choice":
                    loss = choice_loss(out.choice_logits[i, : len(q.options)], torch.as_tensor(t)[None])
                elif q.qtype == "score":
                    loss = crps_loss(out.score_logits[i, : q.n_bins], torch.as_tensor(t)[None])
                elif q.qtype == "noul":
                    loss = bernoulli_brier(out.noul_logits[i], torch.tensor([t]))
                else:
                    loss = pinball_loss(out.quantiles[i], torch.as_tensor(t, dtype=torch.float32)[None], taus)
                expected[q.qtype].append(loss)
            flat += 1
    assert all(expected.values())  # every qtype occurs
    for qtype in got:
        torch.testing.assert_close(torch.stack(got[qtype]), torch.stack(expected[qtype]), rtol=1e-5, atol=1e-6)


def test_group_advantages_of_a_wave_equal_one_decision_at_a_time():
    g = torch.Generator().manual_seed(1)
    rewards = torch.rand(6, 8, generator=g).round(decimals=1)  # ties within groups
    rewards[2] = 0.3  # a group with no signal
    for scale in ("group", "batch", "none"):
        wave = group_advantages(rewards, scale, batch_std=0.25)
        rows = torch.stack([group_advantages(r, scale, batch_std=0.25) for r in rewards])
        torch.testing.assert_close(wave, rows, rtol=0, atol=0)
        assert torch.all(wave[2] == 0)
        torch.testing.assert_close(wave.mean(-1), torch.zeros(6), atol=1e-6, rtol=0)


def test_batch_scaling_is_per_env_and_invariant_to_each_envs_units():
    """``scale_rewards="batch"`` on a mixed wave: each env's advantages equal those of a wave holding that env alone,
    so rescaling one env's rewards (money vs log growth) leaves every advantage unchanged."""
    g = torch.Generator().manual_seed(3)
    rewards = torch.rand(9, 8, generator=g)
    env_ids = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    mixed = group_advantages(rewards, "batch", env_batch_std(rewards, env_ids))
    scaled = rewards * torch.tensor([100.0, 1.0, 10.0])[env_ids][:, None]
    rescaled = group_advantages(scaled, "batch", env_batch_std(scaled, env_ids))
    # not exact only because of the +1e-4 in the denominator: the smallest std here is ~0.3, so that is < 1e-3 relative
    torch.testing.assert_close(rescaled, mixed, atol=1e-3, rtol=1e-3)
    for env in range(3):
        alone = rewards[env_ids == env]
        torch.testing.assert_close(mixed[env_ids == env], group_advantages(alone, "batch", float(alone.std())))
    # one std over the whole mixed batch would not be invariant: the large-unit env swamps the others
    pooled = group_advantages(scaled, "batch", float(scaled.std()))
    assert pooled[env_ids == 1].abs().max() < 0.05 * mixed[env_ids == 1].abs().max()


def test_an_outcome_return_is_judged_against_the_others_only():
    """Leave-one-out: the baseline is the mean of the other recent returns, so the advantage moves one for one with the
    return it judges (with the own return in the mean it would move by (n - 1) / n, and be +-1 x scale at n = 2)."""
    others = [0.0, 1.0, 2.0]
    for ret in (-3.0, 1.0, 10.0):
        assert outcome_advantage(ret, [*others, ret], scale=False) == pytest.approx(ret - 1.0)
    assert outcome_advantage(5.0, [5.0], scale=False) == 0.0  # no other return yet: no baseline
    small, large = outcome_advantage(1.0, [0.0, 1.0], True), outcome_advantage(1.0, [0.0, 0.0, 0.0, 1.0], True)
    assert small == pytest.approx(1.0 / (0.5 + 1e-4))  # scaled by the std of the whole window
    assert large == pytest.approx(1.0 / (float(np.std([0.0, 0.0, 0.0, 1.0])) + 1e-4))
