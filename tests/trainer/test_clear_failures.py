"""Clear failures at the edges a new user meets: missing paths, a config without weights, a model without a tokenizer,
decisions past the backbone's positions; the README's offline Python API example; evaluate.py's settings."""

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoConfig, AutoTokenizer

from alea_trl import AleaEnvGRPOTrainer, AleaModel
from alea_trl.envs import make_env
from alea_trl.evaluation import evaluation_sums
from alea_trl.loading import load_model
from alea_trl.testing import tiny_backbone_config


ROOT = Path(__file__).resolve().parents[2]
TINY_ASSET = "recipes/assets/tiny-qwen3"


def _evaluate_recipe():
    spec = importlib.util.spec_from_file_location("evaluate_recipe", ROOT / "recipes" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_missing_local_path_fails_at_once_naming_it(tmp_path, monkeypatch, make_args):
    missing = tmp_path / "no_such_run"
    with pytest.raises(ValueError, match=re.escape(f"'{missing}' does not exist")):
        AleaModel.from_pretrained(missing)
    with pytest.raises(ValueError, match="AleaEnvGRPOTrainer: field 'model': .*does not exist"):
        AleaEnvGRPOTrainer(str(missing), args=make_args())
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="rl_env.py: field 'model_name_or_path': 'recipes/assets/tiny-qwen4'"):
        load_model("recipes/assets/tiny-qwen4", who="rl_env.py")
    # a name that is also a valid Hub id is a local path when its first directory exists here
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ValueError, match=re.escape("'runs/quickstart' does not exist")):
        AleaModel.from_pretrained("runs/quickstart")


def test_a_config_without_weights_is_refused_with_the_way_to_random_weights(monkeypatch, make_args):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="holds a qwen3 config but no weights") as error:
        AleaEnvGRPOTrainer(TINY_ASSET, args=make_args())
    suggestion = re.search(r"(AleaModel\.from_backbone\(AutoConfig\.from_pretrained\('[^']+'\)\))", str(error.value))
    model = eval(suggestion.group(1), {"AleaModel": AleaModel, "AutoConfig": AutoConfig})  # the advice works
    assert isinstance(model, AleaModel) and model.config.backbone_name_or_path is None


def test_the_tokenizer_comes_from_where_the_model_came_from_or_its_absence_is_named(monkeypatch, make_args):
    monkeypatch.chdir(ROOT)
    in_memory = AleaModel.from_backbone(tiny_backbone_config("qwen3", vocab_size=801))
    with pytest.raises(ValueError, match="AleaEnvGRPOTrainer: field 'processing_class'"):
        AleaEnvGRPOTrainer(in_memory, args=make_args())
    # built from the asset's config: the tokenizer is the one beside that config
    trainer = AleaEnvGRPOTrainer(AleaModel.from_backbone(AutoConfig.from_pretrained(TINY_ASSET)), args=make_args())
    assert trainer.processing_class.get_vocab() == AutoTokenizer.from_pretrained(TINY_ASSET).get_vocab()


def test_predict_stays_within_the_backbones_positions(tokenizer):
    config = tiny_backbone_config("qwen3", vocab_size=len(tokenizer))
    config.max_position_embeddings = 64
    model = AleaModel.from_backbone(config)
    decision = make_env("kelly").reset(np.random.default_rng(0)).observe()  # a few hundred tokens
    with pytest.raises(ValueError, match="kelly"):  # the decision does not fit 64 positions: refused, not run
        model.predict([decision], tokenizer)
    with pytest.raises(
        ValueError, match="field 'max_len': 128 tokens is more than .*max_position_embeddings \\(64\\)"
    ):
        model.predict([decision], tokenizer, max_len=128)
    with pytest.raises(ValueError, match="field 'max_len'"):  # the evaluation refuses too, instead of skipping all
        evaluation_sums(model, tokenizer, ["kelly"], episodes=1, max_len=128)
    config.max_position_embeddings = 4096
    roomy = AleaModel.from_backbone(config)
    assert roomy.decision_len_limit() == 4096 and len(roomy.predict([decision], tokenizer)) == 1


def test_readme_python_api_offline_example_trains_and_saves(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    start = text.index("## Python API")
    section = text[start : text.index("\n## ", start + 1)]
    example = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "tiny-qwen3" in b)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "python_api"
    namespace: dict = {}
    exec(compile(example.replace('"runs/python_api"', repr(str(out))), "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 10 and set(trainer.last_eval_table) == {"kelly", "nim"}
    reloaded = AleaModel.from_pretrained(out)
    assert reloaded.config.get_text_config()._name_or_path == TINY_ASSET
    assert "eval_kelly/normalized_score" in json.dumps([h for h in trainer.state.log_history])
    assert (out / "README.md").exists() and "## Evaluation" in (out / "README.md").read_text()


def test_evaluate_recipe_replays_the_runs_evaluation_and_says_so(tiny_model, tokenizer, make_args, capsys):
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=make_args(envs=["nim", "kelly"]), processing_class=tokenizer)
    trainer.train()
    trainer.evaluate(episodes=3)
    trainer.save_model()
    trainer.save_evaluation()
    out = trainer.args.output_dir
    evaluate = _evaluate_recipe()
    capsys.readouterr()
    table = evaluate.main(evaluate.EvaluateArguments(model_name_or_path=out))
    printed = capsys.readouterr().out
    seed = trainer.args.seed + 1
    assert (
        f"Evaluating ['nim', 'kelly'], 3 episodes per env, seed {seed} (envs, episodes, seed from the run's" in printed
    )
    for env, row in trainer.last_eval_table.items():  # the same episodes: the same figures
        for figure in ("return", "random", "oracle", "report/noul"):
            assert table[env][figure] == pytest.approx(row[figure], abs=1e-6), (env, figure)
    # given arguments win over the run's, and the config file the script's docstring names exists
    (args,) = evaluate.make_parser().parse_args_and_config(["--config", str(ROOT / "recipes/configs/evaluate.yaml")])
    assert args.model_name_or_path == "runs/quickstart" and args.episodes is None and args.seed is None
    args.model_name_or_path, args.episodes = out, 1
    assert evaluate.resolve_settings(args)[2:4] == (1, seed)
