"""From a trained run to the Hub and back: every output kind reloads with the trained model's answers, the model card
reads back with huggingface_hub and its quick start runs, pushes save locally first and fail in one message."""

import contextlib
import importlib.util
import io
import os
import re
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, ModelCard
from peft import PeftModel
from transformers import AutoModel, AutoTokenizer

from alea_trl import AleaEnvGRPOTrainer, AleaModel
from alea_trl.evaluation import evaluate_policy
from alea_trl.model_files import BASE_BACKBONE_DIR
from alea_trl.testing import tiny_backbone_config
from alea_trl.trainer.outputs.hub import HubPushError

from ..conftest import RELOAD_ATOL, assert_reloads_identically
from .test_modeling_helpers import fresh_decisions


ROOT = Path(__file__).resolve().parents[2]
ENVS = ["kelly", "nim"]  # one dense and one outcome env: every qtype, both kinds of decision


def _recipe(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def backbone_dir(tmp_path, tokenizer):
    """A tiny pretrained decoder saved locally with its tokenizer: what a Hub backbone looks like offline."""
    torch.manual_seed(0)
    path = tmp_path / "backbone"
    AutoModel.from_config(tiny_backbone_config("qwen3", vocab_size=len(tokenizer))).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _trained(model, make_args, **overrides):
    settings = dict(envs=ENVS, max_steps=2, eval_episodes=2, tail_k=1, learning_rate=1e-2, lr_head=1e-2)
    trainer = AleaEnvGRPOTrainer(model, args=make_args(**{**settings, **overrides}))
    trainer.train()
    return trainer


def _assert_same_answers(got_model, want_model, decisions, tokenizer):
    got, want = got_model.predict(decisions, tokenizer), want_model.predict(decisions, tokenizer)
    for x, y in zip(got, want, strict=True):
        assert x.keys() == y.keys()
        for qid in x:
            torch.testing.assert_close(torch.as_tensor(x[qid]), torch.as_tensor(y[qid]), atol=RELOAD_ATOL, rtol=0)


@pytest.mark.parametrize("train_mode", ["full", "heads", "tail", "lora"])
def test_every_output_kind_reloads_with_the_trained_answers(train_mode, backbone_dir, tokenizer, make_args, tmp_path):
    # the backbone is given by path, as a Hub id would be: the trainer loads the tokenizer from it too
    trainer = _trained(backbone_dir, make_args, train_mode=train_mode)
    trained = trainer.accelerator.unwrap_model(trainer.model)
    out = tmp_path / "out"
    trainer.save_model(str(out))
    decisions = fresh_decisions(ENVS, 3)
    reloaded = [AleaModel.from_pretrained(out), AutoModel.from_pretrained(out)]
    if train_mode == "lora":
        assert (out / "adapter_config.json").exists() and (out / "config.json").exists()
        for model in reloaded:  # onto the base the adapter names (the backbone's path): the trained answers
            assert (
                isinstance(model, PeftModel) and model.peft_config["default"].base_model_name_or_path == backbone_dir
            )
            _assert_same_answers(model, trained, decisions, tokenizer)
        merged_dir = tmp_path / "merged"
        AleaModel.from_pretrained(out).merge_and_unload().save_pretrained(merged_dir)
        merged = AutoModel.from_pretrained(merged_dir)
        assert isinstance(merged, AleaModel) and not (merged_dir / "adapter_config.json").exists()
        _assert_same_answers(merged, trained, decisions, tokenizer)
    else:
        for model in reloaded:
            assert isinstance(model, AleaModel) and model.config.backbone_name_or_path == backbone_dir
            assert_reloads_identically(model, trained, decisions, tokenizer)
    # recipes/evaluate.py takes every kind (and the tokenizer the trainer saved beside it): the trained model's figures
    evaluate = _recipe("evaluate")
    table = evaluate.main(evaluate.EvaluateArguments(model_name_or_path=str(out), envs=["kelly"], episodes=2))
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tokenizer.get_vocab()
    want = evaluate_policy(trained, tokenizer, ["kelly"], episodes=2, seed=0)["kelly"]
    for figure in ("return", "expected/policy", "report/noul", "report/regress"):
        assert table["kelly"][figure] == pytest.approx(want[figure], abs=1e-5), figure


def test_lora_on_a_random_backbone_saves_its_base_beside_the_adapter(tiny_model, tokenizer, make_args, tmp_path):
    trainer = AleaEnvGRPOTrainer(
        tiny_model(),
        args=make_args(envs=ENVS, max_steps=2, train_mode="lora", tail_k=1, lr_head=1e-2),
        processing_class=tokenizer,
    )
    trainer.train()
    out = tmp_path / "out"
    trainer.save_model(str(out))
    assert (out / BASE_BACKBONE_DIR / "model.safetensors").exists()
    reloaded = AleaModel.from_pretrained(out)
    _assert_same_answers(
        reloaded, trainer.accelerator.unwrap_model(trainer.model), fresh_decisions(ENVS, 3), tokenizer
    )


def test_model_card_reads_back_and_its_quick_start_runs(tiny_model, tokenizer, make_args, tmp_path, capsys):
    model = tiny_model()
    model.config.backbone_name_or_path = "Qwen/Qwen3-0.6B"  # as from_backbone records a Hub backbone
    trainer = AleaEnvGRPOTrainer(
        model,
        args=make_args(envs=ENVS, hub_model_id="me/alea-tiny", num_generations_per_env={"nim": 6}),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.evaluate()
    trainer.save_model()
    trainer.create_model_card(tags=["zz-mine", "calibration"])
    out = Path(trainer.args.output_dir)
    text = (out / "README.md").read_text()
    card = ModelCard.load(out / "README.md")
    # the default update: dense decisions by every legal action, outcome ones by groups of k (nim with its own k)
    assert "dense decisions train on every legal action's exact expected reward" in text
    assert "outcome decisions are GRPO groups of 4 (nim: 6) actions valued by Monte Carlo branching" in text

    assert (
        card.data.base_model == "Qwen/Qwen3-0.6B"
        and "[Qwen/Qwen3-0.6B](https://huggingface.co/Qwen/Qwen3-0.6B)" in text
    )
    assert card.data.tags == sorted(card.data.tags) and {"alea", "grpo", "kelly", "nim", "zz-mine"} <= set(
        card.data.tags
    )
    assert "licence" not in text and "None" not in text and "pipeline(" not in text
    # the evaluation as model-index metadata, value for value with the trainer's table
    results = {(r.dataset_name, r.metric_type): r for r in card.data.eval_results}
    metric_types = {"return": "mean_reward", "normalized_score": "normalized_score", "regret": "regret"}
    metric_types |= {"expected_score": "expected_score", "skill/noul": "skill_noul", "skill/regress": "skill_regress"}
    for env in ENVS:
        row = trainer.last_eval_table[env]
        assert re.search(rf"^\| {env} \| {row['return']:.3f} \|", text, re.M)  # and as a table
        for figure, metric_type in metric_types.items():
            if figure in row and row[figure] == row[figure]:
                assert results[(env, metric_type)].metric_value == round(row[figure], 4)
                assert results[(env, metric_type)].dataset_args == {
                    "episodes": trainer.args.eval_episodes,
                    "seed": trainer.args.seed + 1,
                }
            else:  # not applicable (nim has no expected rewards) or undefined (NaN): not claimed
                assert (env, metric_type) not in results
    assert results[("kelly", "regret")].metric_value == round(trainer.last_eval_table["kelly"]["regret"], 4)
    # what it answers: every question of both envs, with its qtype
    for env in ENVS:
        for q in fresh_decisions([env], 1)[0].questions:
            assert f"| {env} | " in text and f"| `{q.qid}` | {q.qtype}" in text
    # citations: GRPO and the scoring rule of every qtype kelly and nim ask (noul, score, regress; choice: the act)
    for key in ("shao2024deepseekmath", "gneiting2007strictly", "brier1950", "epstein1969", "koenker1978", "good1952"):
        assert key in text
    assert "hub_token" not in text and "output_dir" not in text

    # the quick start, pointed at the saved folder instead of the Hub repo, runs and answers a decision
    assert "pip install alea-trl" in text
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert code.count('"me/alea-tiny"') == 2
    exec(compile(code.replace('"me/alea-tiny"', repr(str(out))), "quick_start", "exec"), {})
    printed = capsys.readouterr().out
    assert "act choice tensor(" in printed and "p_heads noul" in printed and "action:" in printed


def test_push_to_hub_uploads_the_saved_folder(tiny_model, tokenizer, make_args, monkeypatch):
    uploads = []

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, repo_id, folder_path, ignore_patterns=None, **kwargs):  # the network boundary
        files = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
        uploads.append((repo_id, files, ignore_patterns, (Path(folder_path) / "README.md").read_text()))
        return "commit"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    args = make_args(envs=ENVS, hub_model_id="me/alea-tiny", save_strategy="steps", save_steps=1)
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    trainer.train()
    assert trainer.push_to_hub() == "commit"
    ((repo, files, ignored, card),) = uploads
    assert repo == "me/alea-tiny"
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(files)
    assert "checkpoint-*" in ignored and any(f.startswith("checkpoint-") for f in files)  # saved, not uploaded
    assert 'AleaModel.from_pretrained("me/alea-tiny")' in card


def test_push_after_training_saves_first_then_fails_in_one_message(tiny_model, tokenizer, make_args, monkeypatch):
    from transformers.utils import hub

    # a Hub endpoint that refuses connections: the real HTTP client meets a closed port
    monkeypatch.setattr(hub, "_hf_api", HfApi(endpoint="http://127.0.0.1:9"))
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=make_args(envs=ENVS, max_steps=1), processing_class=tokenizer)
    trainer.train()
    with pytest.raises(HubPushError) as failure:
        trainer.push_to_hub()
    out = Path(trainer.args.output_dir)
    message = str(failure.value)
    assert "http://127.0.0.1:9" in message and str(out.resolve()) in message and len(message.splitlines()) == 1
    assert failure.value.__cause__ is None and failure.value.__suppress_context__
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md"):
        assert (out / name).exists(), name
    assert_reloads_identically(
        AleaModel.from_pretrained(out),
        trainer.accelerator.unwrap_model(trainer.model),
        fresh_decisions(ENVS, 2),
        tokenizer,
    )


@pytest.mark.parametrize("hub_env", [{"HF_ENDPOINT": "http://127.0.0.1:9"}, {"HF_HUB_OFFLINE": "1"}])
def test_recipe_with_push_to_hub_and_no_hub_fails_at_once_in_one_message(hub_env, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", **hub_env}
    cmd = [
        sys.executable,
        str(ROOT / "recipes" / "rl_env.py"),
        "--config",
        str(ROOT / "recipes/configs/quickstart.yaml"),
    ]
    cmd += ["--output_dir", str(tmp_path / "run"), "--push_to_hub", "true", "--hub_model_id", "me/alea-tiny"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("rl_env.py: push_to_hub=True (me/alea-tiny): ") and "Nothing was trained or saved yet" in last
    )
    assert ("http://127.0.0.1:9" if "HF_ENDPOINT" in hub_env else "HF_HUB_OFFLINE") in last
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_sft_recipe_writes_a_model_card_with_its_evaluation(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the repository
    sft = _recipe("sft")
    out = tmp_path / "sft"
    args = sft.make_parser().parse_args_and_config(
        ["--config", str(ROOT / "recipes/configs/sft_quickstart.yaml"), "--output_dir", str(out)]
        + ["--dataset_dir", str(tmp_path / "data"), "--envs", *ENVS, "--episodes_per_env", "2", "--max_steps", "2"]
        + ["--final_eval_episodes", "2", "--disable_tqdm", "true"]
    )
    trainer = sft.main(*args)
    card = ModelCard.load(out / "README.md")
    assert card.data.tags == sorted(card.data.tags) and {"alea", "sft", *ENVS} <= set(card.data.tags)
    assert {r.dataset_name for r in card.data.eval_results} == set(ENVS)
    assert "trained from scratch" in card.text and "`recipes/assets/tiny-qwen3`" in card.text
    assert "AleaSFTTrainer" in card.text and "brier1950" in card.text and "shao2024" not in card.text
    capsys.readouterr()
    code = re.search(r"```python\n(.*?)```", card.text, re.S).group(1)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, "quick_start", "exec"), {})  # the card names the saved folder: it runs as written
    assert "action:" in printed.getvalue()
    assert trainer.last_eval_settings == {"episodes": 2, "seed": trainer.args.seed + 1, "envs": ENVS}
