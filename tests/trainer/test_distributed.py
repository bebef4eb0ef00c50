"""Two processes under `accelerate launch` (gloo on CPU) train to identical parameters."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


SCRIPT = Path(__file__).with_name("ddp_train.py")


@pytest.mark.parametrize("train_mode", ["full", "lora"])
def test_two_process_ddp_keeps_ranks_identical(tmp_path, train_mode):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[2])}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(SCRIPT),
        str(tmp_path),
        train_mode,
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["world"] == 2
    p0, p1 = ranks[0]["params"], ranks[1]["params"]
    assert p0.keys() == p1.keys()
    for name in p0:
        torch.testing.assert_close(p0[name], p1[name], atol=0, rtol=0, msg=name)
    assert "train_loss" in ranks[0]["log"][-1]
    trained = [n for n in p0 if not torch.equal(p0[n], ranks[0]["init"][n])]
    assert any("head" in n for n in trained) and any("backbone" in n for n in trained)
    # both ranks logged the same gathered metrics
    assert [h.get("loss/policy") for h in ranks[0]["log"]] == [h.get("loss/policy") for h in ranks[1]["log"]]
