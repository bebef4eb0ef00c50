"""The recipes end to end with tiny settings: rl_env.py, sft.py -> rl_env.py, and two CPU processes."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from datasets import load_from_disk
from transformers import AutoModel, AutoTokenizer

import alea_trl  # noqa: F401  (registers the alea model type with AutoModel)
from alea_trl import AleaModel
from alea_trl.decision_data import decision_from_row


ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "recipes" / "configs" / "quickstart.yaml"
TINY = [  # tiny settings on top of the quickstart config
    "--max_steps",
    "2",
    "--eps_per_env",
    "2",
    "--max_batch",
    "10",
    "--per_device_train_batch_size",
    "5",
    "--final_eval_episodes",
    "2",
    "--logging_steps",
    "1",
    "--disable_tqdm",
    "true",
]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rl_env_recipe_trains_evaluates_and_saves_a_hub_ready_model(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the repository
    rl_env = _load("rl_env")
    out = tmp_path / "rl"
    args = rl_env.make_parser().parse_args_and_config(["--config", str(QUICKSTART), "--output_dir", str(out), *TINY])
    table = rl_env.main(*args)
    assert set(table) == {"hmm", "kelly", "newsvendor", "bandit", "nim"}
    assert all(abs(row["oracle"] - row["random"]) > 0 for row in table.values())
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "alea"
    card = (out / "README.md").read_text()
    assert "## Evaluation" in card and "norm.score" in card and "alea" in card and "nim" in card
    model = AutoModel.from_pretrained(out)
    assert isinstance(model, AleaModel)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == model.backbone.config.vocab_size


def test_rl_env_recipe_trains_a_registered_gymnasium_env_with_no_code(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    rl_env = _load("rl_env")
    out = tmp_path / "lake"
    cli = ["--config", str(QUICKSTART), "--output_dir", str(out), *TINY]
    cli += ["--envs", "gym-frozenlake-4x4"]
    table = rl_env.main(*rl_env.make_parser().parse_args_and_config(cli))
    assert set(table) == {"gym-frozenlake-4x4"}  # trained and evaluated on the registered env alone
    card = (out / "README.md").read_text()
    assert "gym-frozenlake-4x4" in card and "every legal action's exact expected reward" in card


def test_sft_then_rl_chain_and_dataset_round_trip(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    sft, rl_env = _load("sft"), _load("rl_env")
    sft_out, data_dir = tmp_path / "sft", tmp_path / "data"
    sft_args = sft.make_parser().parse_args_and_config(
        [
            "--config",
            str(ROOT / "recipes" / "configs" / "sft_quickstart.yaml"),
            "--output_dir",
            str(sft_out),
            "--dataset_dir",
            str(data_dir),
            "--episodes_per_env",
            "2",
            "--max_steps",
            "3",
            "--disable_tqdm",
            "true",
        ]
    )
    trainer = sft.main(*sft_args)
    built = trainer.train_dataset
    reloaded = load_from_disk(str(data_dir))
    assert len(reloaded) == len(built) > 0 and reloaded[:] == built[:]
    decision, targets, act = decision_from_row(reloaded[0])
    assert decision.env == reloaded[0]["env"] and abs(act.sum() - 1) < 1e-6
    assert {"loss/act", "report/noul"} <= {k for h in trainer.state.log_history for k in h}
    rl_args = rl_env.make_parser().parse_args_and_config(
        [
            "--config",
            str(QUICKSTART),
            "--model_name_or_path",
            str(sft_out),
            "--init_from_config",
            "false",
            "--output_dir",
            str(tmp_path / "rl"),
            *TINY,
        ]
    )
    start = AleaModel.from_pretrained(sft_out)
    rl_env.main(*rl_args)
    after = AleaModel.from_pretrained(tmp_path / "rl")
    # RL started from the SFT weights (same architecture and heads) and moved them
    assert start.state_dict().keys() == after.state_dict().keys()
    assert not torch.equal(start.choice_head.weight, after.choice_head.weight)


def test_rl_env_recipe_under_two_cpu_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
        str(ROOT / "recipes" / "rl_env.py"),
        "--config",
        str(QUICKSTART),
        "--output_dir",
        str(tmp_path / "ddp"),
        "--use_cpu",
        "true",
        *TINY,
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "norm.score" in result.stdout and result.stdout.count("norm.score") == 1  # the table, printed once
    assert (tmp_path / "ddp" / "model.safetensors").exists()


def test_a_deepspeed_launch_without_a_cpu_backend_is_refused_in_one_line(tmp_path):
    """What `accelerate launch --config_file accelerate_configs/deepspeed_zero2.yaml` exports to each of two
    processes on a machine without an accelerator, without --ddp_backend gloo: one line naming the flag, before any
    model is built (DeepSpeed's own batch check would fail later, deep in the run, without naming it)."""
    env = {**os.environ, "ACCELERATE_USE_DEEPSPEED": "true", "WORLD_SIZE": "2"}
    cmd = [sys.executable, "recipes/rl_env.py", "--config", str(QUICKSTART), "--use_cpu", "false"]
    result = subprocess.run(cmd + ["--output_dir", str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("rl_env.py: AleaEnvGRPOConfig: field 'ddp_backend'") and "--ddp_backend gloo" in last
    assert "Traceback" not in result.stderr and not any(tmp_path.iterdir())
