"""AleaModel: predict semantics, neutral extras, other backbone families, save/load round trips."""

import random

import pytest
import torch
from transformers import AutoModel

from alea_trl import TAUS, AleaConfig, AleaModel
from alea_trl.collate import collate_segments
from alea_trl.packing import pack_request
from alea_trl.testing import tiny_backbone_config

from .conftest import assert_reloads_identically, random_decision
from .test_packing import _packed_answers, _reference_answers


def _decisions(seed, n):
    rng = random.Random(seed)
    return [random_decision(rng) for _ in range(n)]


def _assert_same_answers(a, b, atol=0.0):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for qid in x:
            torch.testing.assert_close(torch.as_tensor(x[qid]), torch.as_tensor(y[qid]), atol=atol, rtol=0)


def test_predict_returns_valid_answers(make_model, tokenizer):
    model = make_model()
    with torch.no_grad():  # spread the heads so the checks are not trivially met at a near-zero init
        for p in model.regress_head.parameters():
            p.normal_(0, 1.0)
    decisions = _decisions(0, 5)
    answers = model.predict(decisions, tokenizer, batch_size=2)
    for d, ans in zip(decisions, answers):
        assert set(ans) == {q.qid for q in d.questions}
        for q in d.questions:
            a = ans[q.qid]
            if q.qtype in ("choice", "score"):
                n = len(q.options) if q.qtype == "choice" else q.n_bins
                assert a.shape == (n,) and (a > 0).all()
                torch.testing.assert_close(a.sum(), torch.tensor(1.0))
            elif q.qtype == "noul":
                assert isinstance(a, float) and 0.0 < a < 1.0
            else:
                assert a.shape == (len(TAUS),) and (a[1:] >= a[:-1]).all()


def test_extras_are_neutral_at_init(make_model, tokenizer):
    plain = make_model(seed=0)
    extra = make_model(seed=0, use_aux_embed=True, use_bigram=True, use_trigram=True, ngram_buckets=97)
    missing, unexpected = extra.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and sorted(missing) == ["aux_embed.weight", "bigram.weight", "trigram.weight"]
    assert all(float(getattr(extra, m).weight.detach().abs().sum()) == 0.0 for m in ("aux_embed", "bigram", "trigram"))
    decisions = _decisions(1, 3)
    _assert_same_answers(plain.predict(decisions, tokenizer), extra.predict(decisions, tokenizer))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_other_backbone_families_pack_exactly(make_model, tokenizer, family):
    model = make_model(family=family)
    assert model.backbone.config.model_type == family
    decisions = _decisions(2, 2)
    for d, got in zip(decisions, _packed_answers(model, tokenizer, decisions)):
        with torch.no_grad():
            want = _reference_answers(model, tokenizer, d)
        for qid in want:
            torch.testing.assert_close(got[qid], want[qid], atol=1e-5, rtol=0)


def test_round_trip_from_local_backbone_dir(tmp_path, tokenizer):
    # a "pretrained" backbone saved to a local directory stands in for a Hub id such as Qwen/Qwen3-0.6B
    torch.manual_seed(0)
    backbone = AutoModel.from_config(tiny_backbone_config(vocab_size=len(tokenizer)))
    backbone.save_pretrained(tmp_path / "backbone")
    model = AleaModel.from_backbone(str(tmp_path / "backbone"), use_aux_embed=True)
    for name, p in backbone.state_dict().items():  # the pretrained weights are loaded, not re-initialised
        torch.testing.assert_close(model.backbone.state_dict()[name], p, atol=0, rtol=0)
    with torch.no_grad():  # make the extras matter, so reloading them is checked too
        model.aux_embed.weight.normal_()

    model.save_pretrained(tmp_path / "alea")
    tokenizer.save_pretrained(tmp_path / "alea")
    assert (tmp_path / "alea" / "model.safetensors").exists()
    decisions = _decisions(3, 3)

    again = AleaModel.from_pretrained(tmp_path / "alea")
    auto = AutoModel.from_pretrained(tmp_path / "alea")
    assert type(auto) is AleaModel and isinstance(auto.config, AleaConfig) and auto.config.use_aux_embed
    assert_reloads_identically(again, model, decisions, tokenizer)
    assert_reloads_identically(auto, model, decisions, tokenizer)


def test_gradient_checkpointing_gives_the_same_gradients(make_model, tokenizer):
    decisions = _decisions(4, 2)
    batch = collate_segments(
        [pack_request(tokenizer, d.state, d.questions) for d in decisions], tokenizer.pad_token_id
    )
    grads = []
    for gc in (False, True):
        model = make_model(seed=0).train()
        if gc:
            model.gradient_checkpointing_enable()
            assert model.is_gradient_checkpointing
        out = model(**batch.model_inputs())
        loss = out.noul_logits.sum() + out.quantiles.sum() + out.option_logits.sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


def test_predict_rejects_oversize_decision(make_model, tokenizer):
    d = _decisions(5, 1)[0]
    with pytest.raises(ValueError, match="max_len=8"):
        make_model().predict([d], tokenizer, max_len=8)


def test_checkpoint_with_the_former_extra_names_loads_the_same_model(make_model, tokenizer, tmp_path):
    """A checkpoint saved when the n-gram extras were ``use_ngram`` / ``use_ngram2`` (weights ``ngram`` / ``ngram2``)
    loads into ``bigram`` / ``trigram`` with the same weights and answers."""
    import json

    from safetensors.torch import load_file, save_file

    model = make_model(seed=1, use_bigram=True, use_trigram=True, ngram_buckets=97)
    with torch.no_grad():
        model.bigram.weight.normal_()
        model.trigram.weight.normal_()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["use_ngram"], config["use_ngram2"] = config.pop("use_bigram"), config.pop("use_trigram")
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = load_file(tmp_path / "model.safetensors")
    renamed = {k.replace("trigram.", "ngram2.").replace("bigram.", "ngram."): v for k, v in weights.items()}
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})

    reloaded = AleaModel.from_pretrained(tmp_path).eval()
    assert reloaded.config.use_bigram and reloaded.config.use_trigram
    assert torch.equal(reloaded.bigram.weight, model.bigram.weight)
    assert torch.equal(reloaded.trigram.weight, model.trigram.weight)
    decisions = _decisions(2, 3)
    _assert_same_answers(reloaded.predict(decisions, tokenizer), model.predict(decisions, tokenizer), atol=1e-6)
