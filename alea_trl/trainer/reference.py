"""The reference policy of the KL term (``beta != 0``).

Design decisions:
1. A frozen copy of the initial policy, in eval mode, placed like the policy (DeepSpeed, FSDP or plain accelerate).
2. Under LoRA there is no copy: the policy with its adapter disabled is exactly the initial policy.
3. In ``heads`` / ``tail`` modes of plain (unsharded) modules the layers below the trained tail are frozen and equal
   in both, so the reference runs only the layers above the policy's trunk (see ``shared_trunk``).
"""

from __future__ import annotations

import copy

from torch import nn
from trl.models import prepare_deepspeed, prepare_fsdp

from .shared_trunk import first_shared_layer


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` (unwrapped from accelerate) is a peft model."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def build_reference(model: nn.Module, accelerator, deepspeed: bool, fsdp: bool) -> nn.Module:
    """A frozen copy of ``model`` (the unwrapped policy), in eval mode, placed by DeepSpeed, FSDP or accelerate."""
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    if deepspeed:
        return prepare_deepspeed(ref, accelerator)
    if fsdp:
        return prepare_fsdp(ref, accelerator)
    return accelerator.prepare_model(ref, evaluation_mode=True)


def reference_policy(
    model: nn.Module, accelerator, args, deepspeed: bool, fsdp: bool
) -> tuple[nn.Module | None, int | None]:
    """The reference policy of a run and the first decoder layer it must run itself.

    Returns:
        `(nn.Module | None, int | None)`: the frozen copy (``None`` when ``beta == 0`` or under LoRA, whose reference
        is the adapter-disabled policy), and in ``heads`` / ``tail`` modes of plain (unsharded) modules the first
        layer above the policy's frozen trunk, which the reference shares (else ``None``).
    """
    if args.beta == 0.0 or is_peft_model(model):
        return None, None
    ref = build_reference(model, accelerator, deepspeed, fsdp)
    shared = None if deepspeed or fsdp else first_shared_layer(model, args.train_mode, args.tail_k)
    return ref, shared


__all__ = ["build_reference", "is_peft_model", "reference_policy"]
