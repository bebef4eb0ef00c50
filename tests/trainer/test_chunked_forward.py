"""Length-grouped forwards (``max_batch_tokens``) give the outputs, and the update, of one forward."""

import random

import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.collate import collate_segments
from alea_trl.packing import pack_request
from alea_trl.trainer.forward.policy import chunked_forward, length_groups

from ..conftest import random_decision
from .conftest import TOY_FACTORIES


def test_length_groups_sort_and_respect_the_budget():
    lengths = [30, 5, 12, 30, 7, 50, 6]
    groups = length_groups(lengths, 60)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(lengths)  # consecutive groups of the sorted order
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= 60
    assert length_groups(lengths, None) == [list(range(len(lengths)))]


@pytest.mark.parametrize("budget", [None, 1, 300])
def test_chunked_forward_equals_one_forward(make_model, tokenizer, budget):
    model = make_model()
    rng = random.Random(7)
    decisions = [random_decision(rng) for _ in range(9)]
    packed = [pack_request(tokenizer, d.state, d.questions) for d in decisions]
    with torch.no_grad():
        whole = model(**collate_segments(packed, tokenizer.pad_token_id).model_inputs())

        def forward(batch):
            out = model(**batch.model_inputs())
            return out, out.choice_logits * 2  # a stand-in "reference" that must be merged alike

        def collate(ps):
            return collate_segments(ps, tokenizer.pad_token_id)

        got, ref, batch = chunked_forward(forward, collate, packed, budget)
    assert [tuple(q) for q in batch.questions] == [tuple(d.questions) for d in decisions]
    for name in ("option_logits", "choice_logits", "score_logits", "noul_logits", "quantiles"):
        torch.testing.assert_close(getattr(got, name), getattr(whole, name), atol=1e-5, rtol=0, msg=name)
    torch.testing.assert_close(ref, whole.choice_logits * 2, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode,beta", [("full", 0.0), ("tail", 0.1)])
def test_length_grouped_step_equals_single_forward_step(tiny_model, tokenizer, make_args, mode, beta):
    """The same first updates with a token budget that forces a forward per one or two decisions."""
    params = []
    for budget in (None, 64):
        model = tiny_model()
        args = make_args(
            envs=["named_best", "three_in_a_row"],
            outcome_advantage="rtg",  # branch continuations are forwards of their own, outside the loss's groups
            max_steps=2,
            per_device_train_batch_size=8,
            train_mode=mode,
            tail_k=1,
            beta=beta,
            optim="sgd",
            max_grad_norm=0.0,
            max_len=64,
            max_batch_tokens=budget,
        )
        trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
        calls = []
        trainer.accelerator.unwrap_model(trainer.model).register_forward_pre_hook(lambda *a, c=calls: c.append(1))
        trainer.train()
        assert len(calls) == 2 if budget is None else len(calls) >= 2 * 4  # one / several forwards per micro-batch
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for name in params[0]:
        torch.testing.assert_close(params[1][name], params[0][name], atol=1e-6, rtol=1e-4, msg=name)
