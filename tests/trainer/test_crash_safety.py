"""A process killed at any moment, including in the middle of a checkpoint save, leaves its newest complete
checkpoint loadable; resuming picks it (never a half-written one) and reaches the same weights as a run that was
never interrupted."""

import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from alea_trl import AleaModel
from alea_trl.trainer.outputs.checkpointing import COMPLETE_MARKER, POOL_STATE_NAME, last_complete_checkpoint


SCRIPT = Path(__file__).with_name("crash_train.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[2])}
MAX_STEPS = 6


def _run(out, *extra, check=True):
    cmd = [sys.executable, str(SCRIPT), str(out), str(MAX_STEPS), *extra]
    result = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def _final(out):
    return torch.load(Path(out) / "final_params.pt")


def _assert_loadable(checkpoint):
    assert os.path.exists(os.path.join(checkpoint, COMPLETE_MARKER))
    AleaModel.from_pretrained(checkpoint)
    with open(os.path.join(checkpoint, POOL_STATE_NAME.format(rank=0)), "rb") as f:
        assert pickle.load(f)["pool"].env_names == ["kelly", "bandit"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    _run(out, "fresh")
    return _final(out)


def test_killed_during_save_resumes_from_the_last_complete_checkpoint(tmp_path, uninterrupted):
    result = _run(tmp_path, "fresh", "4", check=False)
    assert result.returncode == -signal.SIGKILL
    half = tmp_path / "checkpoint-4"
    assert (half / "model.safetensors").exists() and not (half / COMPLETE_MARKER).exists()
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-3")
    _assert_loadable(str(tmp_path / "checkpoint-3"))
    assert (tmp_path / "checkpoint-2").exists()  # rotation waits for the new checkpoint to be complete
    _run(tmp_path, "resume")
    for name, p in uninterrupted.items():
        torch.testing.assert_close(_final(tmp_path)[name], p, atol=0, rtol=0, msg=name)


def test_refuses_an_incomplete_checkpoint(tmp_path, tiny_model, tokenizer, make_args):
    from alea_trl import AleaEnvGRPOTrainer

    (tmp_path / "checkpoint-7").mkdir(parents=True)
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=make_args(output_dir=str(tmp_path)), processing_class=tokenizer)
    with pytest.raises(ValueError, match="incomplete"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-7"))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        trainer.train(resume_from_checkpoint=True)


def test_sigkill_at_random_moments(tmp_path, uninterrupted):
    rng = random.Random(0)
    for attempt in range(4):
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(tmp_path), str(MAX_STEPS), "resume" if attempt else "fresh"],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(6.0, 12.0))  # start-up is ~5 s; then a step and a checkpoint about every 0.3 s
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        newest = last_complete_checkpoint(str(tmp_path))
        if newest is not None:
            _assert_loadable(newest)
        if (tmp_path / "final_params.pt").exists():
            break
    if not (tmp_path / "final_params.pt").exists():
        _run(tmp_path, "resume" if last_complete_checkpoint(str(tmp_path)) else "fresh")
    for name, p in uninterrupted.items():
        torch.testing.assert_close(_final(tmp_path)[name], p, atol=0, rtol=0, msg=name)
