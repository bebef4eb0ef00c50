"""benchmarks/gpu_bench.py, the one GPU script, run end to end on CPU with a tiny backbone: it has no GPU in CI, so
this is what keeps it runnable, and its accounting counts exactly the decisions each optimizer step trained on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]


def test_gpu_bench_tiny_on_cpu_counts_every_trained_decision(tmp_path):
    batch, steps = 8, 3
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--tiny", "--device", "cpu"]
    cmd += ["--variants", "sdpa", "--steps", str(steps), "--warmup", "1", "--batch", str(batch)]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["device"] == "cpu"
    (result,) = out["results"]
    assert "error" not in result, result
    assert result["attn"] == "sdpa"
    # the step timer counts the rows of the loss forwards: per_device_train_batch_size decisions per optimizer step
    assert result["decisions_per_s"] * result["step_s"] == pytest.approx(batch)
    assert result["tokens_per_decision"] > 20  # a decision's state, questions and options, not a padded slot
    assert 0 < result["mfu"] < 1
