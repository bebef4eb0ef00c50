"""The four scoring rules are strictly proper: the truth has the lowest exact expected loss."""

import numpy as np
import pytest
import torch

from alea_trl.losses import bernoulli_brier, choice_loss, crps_loss, pinball_loss
from alea_trl.questions import TAUS


N_PERTURB = 120


def _expected_categorical(loss_fn, logits, p):
    """Exact expectation over outcomes y ~ p of loss(logits, y), computed outcome by outcome."""
    n = p.shape[0]
    per_outcome = torch.stack([loss_fn(logits[None], torch.tensor([y])) for y in range(n)])
    return float((per_outcome * p).sum())


def test_log_score_and_rps_are_proper():
    g = torch.Generator().manual_seed(0)
    for loss_fn in (choice_loss, crps_loss):
        for _ in range(5):
            n = int(torch.randint(2, 10, (1,), generator=g))
            p = torch.distributions.Dirichlet(torch.ones(n)).sample()
            at_truth = _expected_categorical(loss_fn, p.log(), p)
            for _ in range(N_PERTURB):
                q = torch.softmax(p.log() + torch.randn(n, generator=g) * 0.5, -1)
                assert at_truth < _expected_categorical(loss_fn, q.log(), p)
            # the distribution-target form has the same minimiser
            assert loss_fn(p.log()[None], p[None]) <= loss_fn(q.log()[None], p[None])


def test_brier_is_proper():
    g = torch.Generator().manual_seed(1)
    for p in torch.rand(20, generator=g):

        def expected(logit, p=p):
            yes, no = bernoulli_brier(logit[None], torch.ones(1)), bernoulli_brier(logit[None], torch.zeros(1))
            return float(p * yes + (1 - p) * no)

        at_truth = expected(torch.logit(p))
        for q in torch.rand(N_PERTURB, generator=g):
            if abs(float(q - p)) > 1e-6:
                assert at_truth < expected(torch.logit(q))


def test_pinball_is_proper_against_a_large_sample_set():
    rng = np.random.default_rng(2)
    n = 10007  # prime: tau * n is never an integer, so each empirical quantile is the unique minimiser
    for _ in range(4):
        samples = rng.gamma(rng.uniform(1, 5), rng.uniform(0.5, 3), size=n)
        truth = np.sort(samples)[np.ceil(np.array(TAUS) * n).astype(int) - 1]  # exact empirical quantiles
        target = torch.tensor(samples)[None]
        at_truth = float(pinball_loss(torch.tensor(truth)[None], target, TAUS))
        for _ in range(N_PERTURB):
            bad = np.sort(truth + rng.normal(0, 0.3, size=truth.shape))
            assert at_truth < float(pinball_loss(torch.tensor(bad)[None], target, TAUS))


def test_pinball_sample_mask_averages_each_row_over_its_own_samples():
    q = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    ragged = [torch.tensor([0.5, 1.5, 4.0]), torch.tensor([2.5])]
    padded = torch.zeros(2, 3)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for i, r in enumerate(ragged):
        padded[i, : len(r)], mask[i, : len(r)] = r, True
    want = torch.stack([pinball_loss(q[i : i + 1], ragged[i][None], (0.3, 0.7)) for i in range(2)]).mean()
    torch.testing.assert_close(pinball_loss(q, padded, (0.3, 0.7), sample_mask=mask), want)


def test_pinball_by_hand():
    # one level tau=0.25, quantile 1.0; samples 0 and 3: (1-0.25)*1 and 0.25*2 -> mean 0.625
    got = pinball_loss(torch.tensor([[1.0]]), torch.tensor([[0.0, 3.0]]), (0.25,))
    torch.testing.assert_close(got, torch.tensor(0.625))


def test_gradients_finite_at_extremes():
    for logits in (torch.tensor([[50.0, -50.0, 0.0]]), torch.tensor([[-50.0, 50.0, -50.0]])):
        for target in (torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([2]), torch.tensor([[0.0, 0.0, 1.0]])):
            for fn in (choice_loss, crps_loss):
                x = logits.clone().requires_grad_(True)
                loss = fn(x, target)
                loss.backward()
                assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    # padded options (-inf) do not poison the loss or the gradient
    x = torch.tensor([[1.0, 2.0, float("-inf")]], requires_grad=True)
    for fn in (choice_loss, crps_loss):
        loss = fn(x, torch.tensor([[0.5, 0.5, 0.0]]))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
        x.grad = None
    for logit in (50.0, -50.0):
        for t in (0.0, 1.0):
            x = torch.tensor([logit], requires_grad=True)
            loss = bernoulli_brier(x, torch.tensor([t]))
            loss.backward()
            assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    q = torch.tensor([[-50.0, 0.0, 50.0]], requires_grad=True)
    loss = pinball_loss(q, torch.tensor([[0.0, 1e6]]), (0.1, 0.5, 0.9))
    loss.backward()
    assert torch.isfinite(q.grad).all()


def test_per_row_reduction_averages_to_the_mean():
    g = torch.Generator().manual_seed(0)
    logits, idx = torch.randn(5, 4, generator=g), torch.randint(4, (5,), generator=g)
    q, y = torch.randn(5, 3, generator=g).sort(-1).values, torch.randn(5, 6, generator=g)
    for rule, args in [
        (choice_loss, (logits, idx)),
        (crps_loss, (logits, idx)),
        (bernoulli_brier, (logits[:, 0], torch.rand(5, generator=g))),
        (pinball_loss, (q, y, [0.1, 0.5, 0.9])),
    ]:
        rows = rule(*args, reduction="none")
        assert rows.shape == (5,)
        torch.testing.assert_close(rows.mean(), rule(*args))
    with pytest.raises(ValueError, match="reduction"):
        choice_loss(logits, idx, reduction="sum")
