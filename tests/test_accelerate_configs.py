"""The accelerate launch configs in accelerate_configs/ load with accelerate's own loader and launch as intended."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType


CONFIG_DIR = Path(__file__).resolve().parents[1] / "accelerate_configs"
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.yaml")) + sorted(CONFIG_DIR.glob("*.yml"))

# name -> (distributed_type, num_processes, mixed_precision)
EXPECTED = {
    "single_gpu": (DistributedType.NO, 1, "bf16"),
    "multi_gpu": (DistributedType.MULTI_GPU, 8, "bf16"),
    "deepspeed_zero2": (DistributedType.DEEPSPEED, 8, "bf16"),
    "deepspeed_zero3": (DistributedType.DEEPSPEED, 8, "bf16"),
    "fsdp": (DistributedType.FSDP, 8, "bf16"),
    # MULTI_GPU on purpose: it selects the torchrun launcher, which is what fans out to 2 CPU processes
    "cpu_2proc": (DistributedType.MULTI_GPU, 2, "no"),
}


def _validated_launch_args(path):
    """What `accelerate launch --config_file path script.py` resolves before picking a launcher."""
    args = launch_command_parser().parse_args(["--config_file", str(path), "script.py"])
    args, _, _ = _validate_launch_command(args)
    return args


def test_expected_configs_exist():
    assert {p.stem for p in CONFIG_FILES} >= set(EXPECTED)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_config_loads(path):
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), f"{path.name}: should start with a comment block saying when to use it"
    config = load_config_from_file(str(path))  # raises on unknown keys
    assert isinstance(config, ClusterConfig)
    assert isinstance(config.distributed_type, DistributedType)
    assert config.mixed_precision in ("no", "fp16", "bf16", "fp8")
    assert config.num_processes >= 1
    assert config.num_machines == 1 and config.machine_rank == 0
    args = _validated_launch_args(path)  # the same resolution `accelerate launch` does
    assert args.num_processes == config.num_processes
    assert args.mixed_precision == config.mixed_precision


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_fields(name):
    distributed_type, num_processes, mixed_precision = EXPECTED[name]
    config = load_config_from_file(str(CONFIG_DIR / f"{name}.yaml"))
    assert config.distributed_type == distributed_type
    assert config.num_processes == num_processes
    assert config.mixed_precision == mixed_precision
    assert config.use_cpu is False  # cpu_2proc: the script asks for CPU (use_cpu=True), not the launcher


@pytest.mark.parametrize(("name", "stage"), [("deepspeed_zero2", 2), ("deepspeed_zero3", 3)])
def test_deepspeed_configs(name, stage):
    path = CONFIG_DIR / f"{name}.yaml"
    ds = load_config_from_file(str(path)).deepspeed_config
    assert ds["zero_stage"] == stage
    assert ds["offload_optimizer_device"] == "none" and ds["offload_param_device"] == "none"
    assert ds["zero3_init_flag"] is (stage == 3)
    args = _validated_launch_args(path)
    assert args.use_deepspeed and not args.use_fsdp and not args.multi_gpu


def test_fsdp_config():
    path = CONFIG_DIR / "fsdp.yaml"
    fsdp = load_config_from_file(str(path)).fsdp_config
    assert fsdp["fsdp_version"] == 2
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert fsdp["fsdp_reshard_after_forward"] is True
    assert fsdp["fsdp_activation_checkpointing"] is False  # the trainer does its own
    args = _validated_launch_args(path)
    assert args.use_fsdp and not args.use_deepspeed
    assert args.fsdp_version == 2


@pytest.mark.parametrize("name", ["multi_gpu", "cpu_2proc"])
def test_ddp_configs_use_the_torchrun_launcher(name):
    args = _validated_launch_args(CONFIG_DIR / f"{name}.yaml")
    assert args.multi_gpu and not args.cpu and not args.use_deepspeed and not args.use_fsdp


_RANK_SCRIPT = """
from accelerate import PartialState

state = PartialState(cpu=True)
# one file per rank: the two processes' stdout lines can interleave
with open(f"rank{state.process_index}.txt", "w") as f:
    f.write(f"RANK {state.process_index} WORLD {state.num_processes} BACKEND {state.backend}")
state.wait_for_everyone()
"""


def test_cpu_2proc_starts_two_processes(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIG_DIR / "cpu_2proc.yaml"),
        str(script),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    written = "\n".join(p.read_text() for p in sorted(tmp_path.glob("rank*.txt")))
    reports = sorted(re.findall(r"RANK (\d+) WORLD (\d+) BACKEND (\w+)", written))
    assert reports == [("0", "2", "gloo"), ("1", "2", "gloo")], output
