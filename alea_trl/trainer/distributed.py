"""Ending a distributed run cleanly.

Design decisions:
1. The process group is destroyed explicitly, at the end of a script. Left to interpreter exit, the teardown can
   race a gloo worker thread that is still releasing a finished collective's tensors, and the process aborts with
   "terminate called without an active exception".
2. It is destroyed *after* the trainer is gone. While the trainer lives, DDP's reducer holds the group; destroying
   the group first leaves the reducer with the last reference, so freeing the trainer runs the group's destructor,
   which joins a worker thread that waits for the GIL the main thread holds: a deadlock. ``Trainer.end()`` called
   inside the script's ``main`` destroys the group while the trainer is still alive, i.e. in that order. Hence a
   function for the script's last line, after ``main`` has returned and its trainer has been collected.
"""

from __future__ import annotations

import gc

import torch.distributed as dist
from accelerate import PartialState


def describe_engine(trainer) -> str:
    """The engine a trainer runs under, in words: ``"DeepSpeed ZeRO-3 over gloo, 2 processes"``,
    ``"FSDP2 over gloo, 2 processes"``, ``"DDP over gloo, 2 processes"`` or ``"one process (cpu)"``.

    DeepSpeed's stage is known once ``train()`` has built its engine; before, it says ``"DeepSpeed"``."""
    accelerator = trainer.accelerator
    n = accelerator.num_processes
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
    if trainer.is_deepspeed_enabled:
        engine = trainer.model_wrapped
        stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else None
        name = "DeepSpeed" if stage is None else f"DeepSpeed ZeRO-{stage}"
    elif trainer.is_fsdp_enabled:
        name = f"FSDP{getattr(accelerator.state.fsdp_plugin, 'fsdp_version', 1)}"
    elif n > 1:
        name = "DDP"
    else:
        return f"one process ({accelerator.device})"
    return f"{name} over {backend}, {n} processes"


def end_distributed() -> None:
    """Destroy the default process group, if one is up, once the objects that used it are collected.

    Call it as a script's last line, after the function that held the trainer has returned. A no-op in a single
    process.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()  # a trainer kept alive only by reference cycles goes now, while the group still exists
    PartialState().destroy_process_group()


__all__ = ["describe_engine", "end_distributed"]
