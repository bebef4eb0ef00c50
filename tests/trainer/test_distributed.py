"""Two processes under `accelerate launch` (gloo on CPU) train to identical parameters."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


SCRIPT = Path(__file__).with_name("ddp_train.py")


LAUNCH = [
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
    "--main_process_port",
    "0",
]


def _launch(out, *script_args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[2])}
    cmd = [sys.executable, *LAUNCH, str(SCRIPT), str(out), *script_args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.parametrize(
    "train_mode,mode", [("full", "plain"), ("lora", "plain"), ("full", "chunked"), ("full", "collectives")]
)
def test_two_process_ddp_keeps_ranks_identical(tmp_path, train_mode, mode):
    _launch(tmp_path, train_mode, mode)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["world"] == 2
    p0, p1 = ranks[0]["params"], ranks[1]["params"]
    assert p0.keys() == p1.keys()
    for name in p0:
        torch.testing.assert_close(p0[name], p1[name], atol=0, rtol=0, msg=name)
    assert "train_loss" in ranks[0]["log"][-1]
    trained = [n for n in p0 if not torch.equal(p0[n], ranks[0]["init"][n])]
    assert any("head" in n for n in trained) and any("backbone" in n for n in trained)
    if mode == "chunked":  # the ranks ran different numbers of forwards in a step (no collective per forward)
        assert ranks[0]["forwards"] != ranks[1]["forwards"] and len(ranks[0]["forwards"]) >= 3
    # both ranks logged the same gathered metrics
    assert [h.get("loss/policy") for h in ranks[0]["log"]] == [h.get("loss/policy") for h in ranks[1]["log"]]
    if mode == "collectives":  # the controller saw both ranks' entropies; rank 0 wrote both ranks' actions
        coefs = [[h["entropy_coef"] for h in r["log"] if "entropy_coef" in h] for r in ranks]
        assert coefs[0] == coefs[1] == pytest.approx([0.01, 0.02, 0.03])
        import pandas as pd

        table = pd.read_parquet(tmp_path / "completions" / "completions_00001.parquet")
        assert len(table) > 0 and set(table["env"]) <= {"kelly", "nim"}


def test_two_process_resume_matches_an_uninterrupted_run(tmp_path):
    _launch(tmp_path / "straight", "full", "save")
    _launch(tmp_path / "resumed", "full", "save")
    _launch(tmp_path / "resumed", "full", "resume")
    for rank in (0, 1):
        a = torch.load(tmp_path / "straight" / f"rank{rank}.pt")["params"]
        b = torch.load(tmp_path / "resumed" / f"rank{rank}.pt")["params"]
        for name in a:
            torch.testing.assert_close(b[name], a[name], msg=name)  # allclose: gloo reductions may reorder sums
