"""A warning for half-precision parameters trained by an optimizer that keeps no float32 copy.

Design decisions:
1. AdamW's update of a weight near 1 at a learning rate of 5e-6 is ~5e-6, far below bfloat16's resolution there
   (2^-7, about 0.008): with bfloat16 parameters and a plain torch optimizer most updates round to nothing (after 3
   steps of the 0.6B recipe at its learning rates, 8% of ``down_proj`` elements and no ``norm.weight`` had moved).
   TRL's recipes load float32 weights and train under bfloat16 autocast (``bf16: true``); this warns, once per
   trainer, when a run does otherwise.
2. DeepSpeed keeps float32 master weights of half-precision parameters itself: no warning there.
"""

from __future__ import annotations

import warnings

import torch


HALF = (torch.bfloat16, torch.float16)


def half_precision_trainables(model: torch.nn.Module) -> dict[torch.dtype, int]:
    """The number of trainable parameter elements per half-precision dtype."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.requires_grad and p.dtype in HALF:
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return counts


def warn_if_no_float32_master(model: torch.nn.Module, optimizer, deepspeed: bool) -> bool:
    """Warn when ``model`` has half-precision trainable parameters and ``optimizer`` updates them in place (no float32
    master copy); returns whether it warned."""
    counts = half_precision_trainables(model)
    if deepspeed or not counts:
        return False
    dtypes = ", ".join(f"{n:,} {str(d).removeprefix('torch.')}" for d, n in counts.items())
    warnings.warn(
        f"AleaEnvGRPOTrainer: the optimizer ({type(optimizer).__name__}) updates half-precision parameters in place "
        f"({dtypes} trainable elements) and keeps no float32 copy, so updates smaller than the weight's precision "
        "round to nothing and many weights never move. Load the model in float32 (recipe: `dtype: float32`; "
        "Python: `model_init_kwargs={'dtype': 'float32'}` or `AleaModel.from_pretrained(..., dtype=torch.float32)`) "
        "and train with `bf16: true` (bfloat16 autocast), as TRL's recipes do.",
        UserWarning,
        stacklevel=3,
    )
    return True


__all__ = ["half_precision_trainables", "warn_if_no_float32_master"]
