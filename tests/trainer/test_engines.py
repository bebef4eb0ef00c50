"""Sharded engines and multi-node launches run for real on CPU, over gloo (see engine_train.py).

- FSDP2 (accelerate_configs/fsdp.yaml), DeepSpeed ZeRO-2 and ZeRO-3 (accelerate_configs/deepspeed_zero*.yaml): two
  processes with uneven work (kelly, and nim valued by branching) and ``beta > 0`` train, checkpoint, resume to the
  same weights as an uninterrupted run, evaluate, and save a final model that reloads in this (fresh) process and
  answers as the sharded model did. LoRA under ZeRO-3 saves and reloads too.
- Multi-node on one host: two ``accelerate launch`` commands, ``--num_machines 2 --machine_rank 0|1`` with one process
  each, train the same run as one two-process launch (DDP, and ZeRO-2).

Each launch takes 15-40 s here; ``-m "not engines"`` leaves them out of a quick local run.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from alea_trl import AleaModel


pytestmark = pytest.mark.engines

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
CONFIGS = {"fsdp": "fsdp.yaml", "zero2": "deepspeed_zero2.yaml", "zero3": "deepspeed_zero3.yaml"}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
# sharded runs: a collective that differs between the ranks fails at once, naming both, instead of hanging (DDP with
# gradient checkpointing, in ddp_train.py, crashes under this debug mode in torch 2.13, so it is left out there)
SHARDED_ENV = {**ENV, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def _accelerate(config_file: str | None, launch_args: list, script: str, *script_args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    cmd += ["--config_file", f"accelerate_configs/{config_file}"] if config_file else ["--multi_gpu"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", *launch_args, str(HERE / script)]
    cmd += [str(a) for a in script_args]
    env = SHARDED_ENV if script == "engine_train.py" else ENV
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait(*processes: subprocess.Popen) -> None:
    for proc in processes:
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-5000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(engine: str, out: Path, mode: str, checkpoint: Path | None = None) -> list[dict]:
    """One two-process launch of engine_train.py; the ranks' records."""
    launch = ["--num_processes", "2", "--num_machines", "1", "--main_process_port", "0"]
    args = [engine, out, mode] + ([checkpoint] if checkpoint else [])
    _wait(_accelerate(CONFIGS[engine], launch, "engine_train.py", *args))
    return _ranks(out)


def _two_machines(config_file: str | None, script: str, *script_args) -> None:
    """The same run as two one-process "machines" on this host, rank 0's address 127.0.0.1."""
    port = str(_free_port())
    launches = [
        _accelerate(
            config_file,
            ["--num_processes", "2", "--num_machines", "2", "--machine_rank", str(rank)]
            + ["--main_process_ip", "127.0.0.1", "--main_process_port", port],
            script,
            *script_args,
        )
        for rank in (0, 1)
    ]
    _wait(*launches)


def _ranks(out: Path) -> list[dict]:
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def _assert_engine(ranks: list[dict], engine: str) -> None:
    """The engine asked for really ran: the wrapped model's class, DeepSpeed's stage, ZeRO-3's partitions."""
    assert all(r["world"] == 2 for r in ranks)
    if engine == "fsdp":
        assert all(r["model_type"].startswith("FSDP") for r in ranks)
        assert ranks[0]["engine"] == "FSDP2 over gloo, 2 processes"
        return
    assert ranks[0]["engine"] == f"DeepSpeed ZeRO-{engine[-1]} over gloo, 2 processes"
    assert [r["model_type"] for r in ranks] == ["DeepSpeedEngine"] * 2
    assert [r["zero_stage"] for r in ranks] == [int(engine[-1])] * 2
    if engine == "zero3":  # each rank holds its half of every parameter, nothing more
        for name, (held, whole) in ranks[0]["partitions"].items():
            assert held + ranks[1]["partitions"][name][0] >= whole and held == -(-whole // 2), name
        assert any("head" in n for n in ranks[0]["partitions"])  # the heads were built partitioned too
    else:
        assert ranks[0]["partitions"] == {}  # ZeRO-2 keeps whole parameters on every rank


def _assert_even(ranks: list[dict]) -> None:
    """The ranks' work differed, and every rank ran the same forwards (parameters are gathered per forward)."""
    assert ranks[0]["counts"] == ranks[1]["counts"]
    assert ranks[0]["dummy_forwards"] + ranks[1]["dummy_forwards"] > 0  # uneven work, made even by dummy forwards
    if any("eval_normalized_score" in h for h in ranks[0]["log"]):  # the evaluation's forwards were uneven too
        assert ranks[0]["eval_dummy_forwards"] + ranks[1]["eval_dummy_forwards"] > 0


def _assert_same_weights(a: Path, b: Path) -> None:
    one, other = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert one.keys() == other.keys()
    for name in one:
        torch.testing.assert_close(other[name], one[name], msg=name)


def _assert_reloads(final: Path, ranks: list[dict]) -> AleaModel:
    """The final save loads here with ``AleaModel.from_pretrained`` and answers as the in-memory sharded model did."""
    model = AleaModel.from_pretrained(final).eval()
    with torch.no_grad():
        logits = model(**ranks[0]["inputs"]).choice_logits
    torch.testing.assert_close(logits, ranks[0]["choice_logits"])
    torch.testing.assert_close(logits, ranks[1]["choice_logits"])
    return model


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Uninterrupted runs of each engine, shared by the resume and multi-node tests."""
    runs = {}

    def run(engine: str) -> Path:
        if engine not in runs:
            out = tmp_path_factory.mktemp(f"{engine}_straight")
            _train(engine, out, "train")
            runs[engine] = out
        return runs[engine]

    return run


@pytest.mark.parametrize("engine", ["fsdp", "zero2", "zero3"])
def test_engine_trains_resumes_exactly_and_saves_a_model_that_reloads(engine, straight, tmp_path):
    out = straight(engine)
    ranks = _ranks(out)
    _assert_engine(ranks, engine)
    assert ranks[0]["counts"]["reference"] > 0  # beta > 0: the reference ran
    if engine != "zero2":
        _assert_even(ranks)
    evals = [[h for h in r["log"] if "eval_kelly/return" in h] for r in ranks]
    assert len(evals[0]) == 1 and evals[0] == evals[1]  # evaluate() ran, its episodes split unevenly, figures reduced

    resumed = _train(engine, tmp_path / "resumed", "resume", out / "checkpoint-2")
    _assert_engine(resumed, engine)
    # resumed from step 2 == uninterrupted: fp32 on CPU, optimizer state and RNG restored, measured equal to the bit
    _assert_same_weights(out / "final", tmp_path / "resumed" / "final")

    model = _assert_reloads(out / "final", ranks)
    if engine == "fsdp":  # sharded checkpoints hold no whole weights: compare with the script's initial model
        torch.manual_seed(0)
        init = AleaModel.from_backbone(model.config.text_config, backbone_kwargs={"dtype": torch.float32})
        before = dict(init.named_parameters())
    else:  # DeepSpeed checkpoints also save whole weights: steps 3-4 moved them
        before = load_file(out / "checkpoint-2" / "model.safetensors")
    trained = [n for n, p in model.named_parameters() if not torch.equal(before[n], p)]
    assert any("head" in n for n in trained) and any("backbone" in n for n in trained)


def test_fsdp2_rollouts_in_their_own_forwards_stay_even(tmp_path):
    ranks = _train("fsdp", tmp_path, "separate")
    _assert_engine(ranks, "fsdp")
    _assert_even(ranks)
    assert [h.get("loss") for h in ranks[0]["log"]] == [h.get("loss") for h in ranks[1]["log"]]


def test_lora_under_zero3_trains_saves_and_reloads(tmp_path):
    ranks = _train("zero3", tmp_path, "lora")
    _assert_engine(ranks, "zero3")
    _assert_even(ranks)
    adapter = load_file(tmp_path / "final" / "adapter_model.safetensors")
    lora_b = [t for n, t in adapter.items() if "lora_B" in n]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # the adapters trained (lora_B starts at zero)
    model = _assert_reloads(tmp_path / "final", ranks)
    assert type(model).__name__ == "PeftModel"


def test_two_machines_on_one_host_train_as_one_ddp_launch(tmp_path):
    launch = ["--num_processes", "2", "--num_machines", "1", "--main_process_port", "0"]
    _wait(_accelerate(None, launch, "ddp_train.py", tmp_path / "one", "full", "plain"))
    _two_machines(None, "ddp_train.py", tmp_path / "two", "full", "plain")
    for rank in (0, 1):
        one = torch.load(tmp_path / "one" / f"rank{rank}.pt")
        two = torch.load(tmp_path / "two" / f"rank{rank}.pt")
        assert one["world"] == two["world"] == 2
        for name in one["params"]:
            torch.testing.assert_close(two["params"][name], one["params"][name], msg=name)


def test_two_machines_on_one_host_train_as_one_zero2_launch(straight, tmp_path):
    one = straight("zero2")
    _two_machines(CONFIGS["zero2"], "engine_train.py", "zero2", tmp_path, "train")
    _assert_engine(_ranks(tmp_path), "zero2")
    _assert_same_weights(one / "final", tmp_path / "final")
