"""benchmarks/throughput.py on a tiny backbone: its accounting, not its timings. A distinct env decision is counted
once (the trainer's and the unpacked loop's counts match the env steps they took; replays are counted apart), the
fair TRL set-up's completions are one token, the TRL LM-head switch outlives a runner that finishes first, and one
run produces every ratio the benchmark reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import throughput  # noqa: E402
from throughput_parts.alea_variants import packed_body, unpacked_body  # noqa: E402
from throughput_parts.models import Models  # noqa: E402
from throughput_parts.timing import Runner  # noqa: E402
from throughput_parts.trl_variant import collect_prompts, letter_reward, trl_body, trl_compact_lm_head  # noqa: E402

from alea_trl.envs import BUILTIN_ENVS, make_env  # noqa: E402
from alea_trl.testing import build_qwen_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_qwen_tokenizer()
    # 40 uniform waves before training: outcome episodes end (and their decisions are replayed) within a few steps
    opts = throughput.parse_options(["--shape", "test", "--decisions", "8", "--prefill_waves", "40"])
    return tokenizer, opts, Models(tokenizer, opts.seed, "test")


def run(body, steps: int) -> dict:
    runner = Runner("test", body, blocks=1, warmup=1, measure_s=0.0, min_steps=steps)
    result = runner.run_block()
    runner.join()
    return runner, result


@pytest.mark.parametrize("variant", ["trainer", "unpacked"])
def test_distinct_decisions_are_the_env_steps_taken(setup, monkeypatch, variant):
    tokenizer, opts, models = setup
    k, steps = 2, 12
    body = (
        packed_body(models, tokenizer, k, opts)
        if variant == "trainer"
        else unpacked_body(models, tokenizer, k, opts, 2048)
    )
    runner = Runner("test", body, blocks=1, warmup=1, measure_s=0.0, min_steps=steps)
    env_steps = {"n": 0}
    for name in BUILTIN_ENVS:  # count every env step taken while the runner measures
        cls = type(make_env(name))
        original = cls.step

        def counted(self, action, _original=original):
            env_steps["n"] += runner.measuring
            return _original(self, action)

        monkeypatch.setattr(cls, "step", counted)
    result = runner.run_block()
    runner.join()
    assert result["steps"] == steps
    assert result["distinct"] + result["replays"] == opts.decisions * steps  # every row of every step, once
    assert result["replays"] > 0  # outcome decisions came back when their episode ended ...
    assert result["distinct"] == env_steps["n"]  # ... and were not counted again as env decisions
    assert 0 < result["deferred"] <= result["distinct"]  # fresh outcome decisions (bandit, nim) wait for replay


def test_fair_trl_completions_are_one_token_and_one_group_per_micro_batch(setup):
    tokenizer, opts, models = setup
    k, steps = 2, 2
    datasets, stock_completion = collect_prompts(tokenizer, 16, opts.seed)
    runner, result = run(trl_body(models, tokenizer, k, opts, datasets, stock_completion, stock=False), steps)
    assert result["min_completion_tokens"] == result["max_completion_tokens"] == 1
    assert result["distinct"] == opts.decisions * steps and result["replays"] == 0
    assert result["loss_padding_fraction"] == 0.0  # k copies of one prompt per micro-batch: nothing to pad
    # per decision: the no-grad generation forwards k prompts, the loss forward k (prompt + 1 letter) tokens
    work = result["work_per_row"]
    assert work["tokens_grad_all"] == pytest.approx(work["tokens_nograd_all"] + k)
    assert work["lm_head_grad"] == work["lm_head_nograd"] == k  # one scored position per completion
    _, stock = run(trl_body(models, tokenizer, k, opts, datasets, stock_completion, stock=True), 1)
    assert stock["min_completion_tokens"] == stock_completion > 1  # random weights never stop early
    assert stock["loss_padding_fraction"] > 0  # the five envs' prompts padded to the longest


def test_letter_reward_reads_one_letter():
    rewards = letter_reward([""] * 4, [" B", "A", " AB", " D"], [["x", "y", "z"]] * 4, [[0.1, 0.7, 0.3]] * 4)
    assert rewards == [0.7, 0.1, 0.1, 0.1]  # B -> second option; two letters or a letter past the options: lowest


def test_compact_lm_head_switch_outlives_the_first_runner_to_finish():
    import torch
    import trl.trainer.utils as trl_utils

    cpu = torch.device("cpu")
    assert not trl_utils._use_triton(cpu)
    first, second = trl_compact_lm_head(True), trl_compact_lm_head(True)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # runners interleave: the first to finish is not the last to start
    assert trl_utils._use_triton(cpu)
    second.__exit__(None, None, None)
    assert not trl_utils._use_triton(cpu)


def test_one_run_reports_every_ratio(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--shape", "test", "--ks", "2,4"]
    cmd += ["--unpacked_ks", "2", "--stock_ks", "2", "--n_prompts", "32", "--allow_busy", "--load_check_s", "0.2"]
    # no pre-fill: every trainer row is then a fresh decision, two fifths of them (bandit, nim) left to be replayed
    cmd += ["--prefill_waves", "0", "--min_steps", "5"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    expected = ["trl_k2", "trl_k4", "trl_stock_k2", "unpacked_k2", "unpacked@2048_k2", "unpacked@4096_k2"]
    for name in expected:
        assert out[f"speedup_vs_{name}"] > 0, name
    assert out["by_k"]["2"]["speedup_vs_unpacked"]["best_variant"] in ("unpacked@2048", "unpacked@4096")
    for k in ("2", "4"):
        trainer = out["by_k"][k]["trainer"]
        assert trainer["rows_per_decision"] > 1  # replays are not decisions
        assert trainer["flops_per_decision"]["lm_head"] == 0  # the heads read hidden states, no vocabulary
        assert out["by_k"][k]["trl"]["flops_per_decision"]["lm_head"] > 0
    assert set(out["machine"]) >= {"loadavg_before", "others_busy_cores_before", "others_busy_cores_during_max"}
