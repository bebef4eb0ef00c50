"""Reliability bins on a hand-computed example, the two figures as readable PNGs, and recipes/evaluate.py end to end."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from alea_trl import AleaModel
from alea_trl.plots import DPI, env_scores_bar, reliability_bins, reliability_diagram
from alea_trl.testing import tiny_backbone_config


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "evaluate.py"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("alea_evaluate_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_png(path):
    import matplotlib.image

    assert Path(path).read_bytes()[:8] == PNG_SIGNATURE
    return matplotlib.image.imread(path)  # (H, W, 4)


def test_reliability_bins_hand_computed():
    # 4 bins of width 1/4: [0, .25) holds 0.1, 0.2; [.25, .5) is empty; [.5, .75) holds 0.6; [.75, 1] holds 0.75
    # (the left edge belongs to its bin) and 1.0 (the right edge of [0, 1] belongs to the last bin)
    p = [0.1, 0.2, 0.6, 1.0, 0.75]
    y = [0.0, 0.5, 1.0, 0.8, 0.6]
    mean_p, mean_y, count = reliability_bins(p, y, n_bins=4)
    np.testing.assert_array_equal(count, [2, 0, 1, 2])
    np.testing.assert_allclose(mean_p, [0.15, np.nan, 0.6, 0.875])
    np.testing.assert_allclose(mean_y, [0.25, np.nan, 1.0, 0.7])


def test_reliability_bins_rejects_bad_input():
    with pytest.raises(ValueError, match="one target per forecast"):
        reliability_bins([0.1, 0.2], [0.5])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        reliability_bins([1.2], [0.5])


def test_reliability_diagram_writes_png(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.uniform(size=60)
    p = np.clip(y + rng.normal(0, 0.05, size=60), 0, 1)
    forecasts = [("kelly" if i % 2 else "hmm", "q", float(pi), float(yi)) for i, (pi, yi) in enumerate(zip(p, y))]
    path = reliability_diagram(forecasts, tmp_path / "sub" / "rel.png", n_bins=5, title="test")
    assert path == str(tmp_path / "sub" / "rel.png")
    assert read_png(path).shape == (7.0 * DPI, 6.4 * DPI, 4)
    assert read_png(reliability_diagram([], tmp_path / "empty.png")).shape == (7.0 * DPI, 6.4 * DPI, 4)


def test_env_scores_bar_writes_png(tmp_path):
    table = {
        "kelly": {"return": 1.0, "random": 0.5, "oracle": 1.5, "normalized_score": 0.5, "skill/noul": 0.4},
        # a clipped score, a clipped skill, a NaN skill (skipped) and a qtype the other env lacks
        "nim": {"return": -9.0, "random": 0.0, "oracle": 1.0, "normalized_score": -9.0, "skill/regress": -30.0},
    }
    table["nim"]["skill/noul"] = float("nan")
    path = env_scores_bar(table, tmp_path / "scores.png", title="test")
    assert read_png(path).shape == (7.5 * DPI, 6.4 * DPI, 4)  # 2 envs: the minimum width


def test_evaluate_recipe_end_to_end(tmp_path, tokenizer, recipe):
    torch.manual_seed(0)
    model = AleaModel.from_backbone(tiny_backbone_config(vocab_size=len(tokenizer)))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")

    # 2 episodes of two envs (one dense, one outcome): enough to exercise every output, fast on CPU
    args = recipe.EvaluateArguments(model_name_or_path=str(tmp_path / "model"), envs=["kelly", "nim"], episodes=2)
    recipe.main(args)

    out = tmp_path / "model" / "eval"  # the default output_dir
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results) == {"kelly", "nim"}
    for row in results.values():
        assert math.isfinite(row["oracle"]) and math.isfinite(row["random"])
    read_png(out / "reliability.png")
    read_png(out / "env_scores.png")


def test_evaluate_recipe_parses_config(tmp_path, recipe):
    config = tmp_path / "eval.yaml"
    config.write_text("model_name_or_path: some/model\nenvs: [kelly, nim]\nepisodes: 7\n")
    (args,) = recipe.make_parser().parse_args_and_config(["--config", str(config), "--seed", "3", "--greedy", "false"])
    assert (args.model_name_or_path, args.envs, args.episodes, args.seed, args.greedy) == (
        "some/model",
        ["kelly", "nim"],
        7,
        3,
        False,
    )
    assert args.output_dir is None
