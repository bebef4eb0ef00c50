"""Sharded engines run for real on CPU: two processes under FSDP2 (accelerate_configs/fsdp.yaml, gloo) train with
uneven work per rank, checkpoint, resume exactly, and save a final model that reloads (see engine_train.py).

DeepSpeed is not run here: accelerate selects DeepSpeed only with ``cpu=False``, and on a machine without an
accelerator ``PartialState`` then finds no distributed backend and starts a single process, so DeepSpeed's batch
check fails (README, "Engines"). ``benchmarks/gpu_distributed.sh`` runs ZeRO-2/3 on a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from alea_trl import AleaModel


# DETAIL: a collective that differs between the ranks fails at once, naming both, instead of hanging
SCRIPT = Path(__file__).with_name("engine_train.py")
ROOT = SCRIPT.parents[2]


def _launch(*script_args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/fsdp.yaml"]
    launch += ["--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "0"]
    result = subprocess.run(
        [*launch, str(SCRIPT), *map(str, script_args)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-4000:]


def _ranks(out):
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def _assert_even(ranks):
    """The model was sharded, the ranks' work differed, and every rank ran the same forwards."""
    assert all(r["model_type"].startswith("FSDP") for r in ranks)
    assert ranks[0]["counts"] == ranks[1]["counts"] and ranks[0]["counts"]["reference"] > 0
    assert ranks[0]["dummy_forwards"] + ranks[1]["dummy_forwards"] > 0  # uneven work, made even by dummy forwards


def test_fsdp2_trains_resumes_exactly_and_saves_a_model_that_reloads(tmp_path):
    _launch(tmp_path / "straight", "train")
    _launch(tmp_path / "resumed", "resume", tmp_path / "straight" / "checkpoint-2")
    straight, resumed = _ranks(tmp_path / "straight"), _ranks(tmp_path / "resumed")
    _assert_even(straight)
    _assert_even(resumed)
    evals = [[h for h in r["log"] if "eval_kelly/return" in h] for r in straight]
    assert len(evals[0]) == 1 and evals[0] == evals[1]  # evaluate() ran, its episodes split unevenly, figures reduced

    a = AleaModel.from_pretrained(tmp_path / "straight" / "final").eval()
    b = AleaModel.from_pretrained(tmp_path / "resumed" / "final").eval()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(q, p, msg=name)  # resumed from step 2 == uninterrupted
    torch.manual_seed(0)  # the script's initial model
    init = AleaModel.from_backbone(a.config.text_config, backbone_kwargs={"dtype": torch.float32})
    trained = [n for n, p in init.named_parameters() if not torch.equal(p, a.get_parameter(n))]
    assert any("head" in n for n in trained) and any("backbone" in n for n in trained)
    with torch.no_grad():  # the saved model answers as the in-memory sharded model did
        reloaded = a(**straight[0]["inputs"]).choice_logits
    torch.testing.assert_close(reloaded, straight[0]["choice_logits"])


def test_fsdp2_rollouts_in_their_own_forwards_stay_even(tmp_path):
    _launch(tmp_path, "separate")
    ranks = _ranks(tmp_path)
    _assert_even(ranks)
    assert [h.get("loss") for h in ranks[0]["log"]] == [h.get("loss") for h in ranks[1]["log"]]
