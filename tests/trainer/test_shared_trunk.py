"""The reference's act logits computed on the policy's frozen trunk equal a full reference forward."""

import copy
import random

import pytest
import torch

from alea_trl.collate import collate_segments
from alea_trl.packing import pack_request
from alea_trl.trainer.forward.reference import captured_trunk, first_shared_layer, reference_choice_logits
from alea_trl.trainer.model_setup import apply_train_mode, decoder_layers

from ..conftest import random_decision


@pytest.mark.parametrize("family", ["qwen3", "llama", "gpt2"])
@pytest.mark.parametrize("mode", ["heads", "tail"])
def test_shared_trunk_reference_equals_full_reference(make_model, tokenizer, family, mode):
    policy = make_model(family=family)
    apply_train_mode(policy, mode, tail_k=1)
    reference = copy.deepcopy(policy)
    with torch.no_grad():  # the policy moves away from the reference where it trains
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    rng = random.Random(0)
    decisions = [random_decision(rng) for _ in range(3)]
    batch = collate_segments(
        [pack_request(tokenizer, d.state, d.questions) for d in decisions], tokenizer.pad_token_id
    )
    layer = first_shared_layer(policy, mode, tail_k=1)
    assert layer == (len(decoder_layers(policy.backbone)[1]) - (0 if mode == "heads" else 1))
    with torch.no_grad(), captured_trunk(policy, layer) as captured:
        output = policy(**batch.model_inputs())
    ref_choice = reference_choice_logits(reference, captured, batch, layer)
    with torch.no_grad():
        want_ref = reference(**batch.model_inputs()).choice_logits
        want_policy = policy(**batch.model_inputs()).choice_logits
    torch.testing.assert_close(ref_choice, want_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(output.choice_logits, want_policy, atol=0, rtol=0)
    assert not torch.allclose(want_ref[torch.isfinite(want_ref)], want_policy[torch.isfinite(want_policy)])


def test_no_sharing_with_extras_or_full_mode(make_model):
    assert first_shared_layer(make_model(use_aux_embed=True), "tail", 1) is None
    assert first_shared_layer(make_model(), "full", 1) is None
    assert first_shared_layer(make_model(), "lora", 1) is None
