"""The reference policy of the KL term (``beta != 0``).

Design decisions:
1. A frozen copy of the initial policy, in eval mode, placed like the policy (TRL's ``prepare_deepspeed`` /
   ``prepare_fsdp``, or accelerate's ``prepare_model`` for evaluation). TRL builds its reference by loading the
   model's checkpoint again; here the policy may have fresh heads that exist only in memory, so the reference is
   copied from the policy: with TRL's ``create_reference_model`` (a deep copy, frozen), and under DeepSpeed ZeRO-3,
   whose partitioned parameters cannot be deep-copied (``create_reference_model`` refuses), by building the model
   from its config inside ZeRO-3's partitioned init and copying each parameter gathered.
2. Under LoRA there is no copy: the policy with its adapter disabled is exactly the initial policy.
3. In ``heads`` / ``tail`` modes of plain (unsharded) modules the layers below the trained tail are frozen and equal
   in both, so the reference runs only the layers above the policy's trunk (see ``shared_trunk``).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from transformers.integrations import is_deepspeed_zero3_enabled
from trl.models import prepare_deepspeed, prepare_fsdp

from .shared_trunk import first_shared_layer


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` (unwrapped from accelerate) is a peft model."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _zero3_copy(model: nn.Module) -> nn.Module:
    """A copy of a ZeRO-3 partitioned ``model``: built partitioned from its config, each parameter and buffer copied
    while gathered."""
    import deepspeed

    ref = type(model)._from_config(model.config, dtype=model.dtype)  # partitioned: transformers enters zero.Init
    source = dict(model.named_parameters())
    for name, param in ref.named_parameters():
        with deepspeed.zero.GatheredParameters([param, source[name]], modifier_rank=0):
            if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
                param.data.copy_(source[name].data)
    for (_, buffer), (_, own) in zip(ref.named_buffers(), model.named_buffers()):
        buffer.data.copy_(own.data)
    return ref.requires_grad_(False).eval()


def build_reference(model: nn.Module, accelerator, deepspeed: bool, fsdp: bool) -> nn.Module:
    """A frozen copy of ``model`` (the unwrapped policy), in eval mode, placed by DeepSpeed, FSDP or accelerate."""
    if deepspeed and is_deepspeed_zero3_enabled():
        ref = _zero3_copy(model)
    else:
        with warnings.catch_warnings():  # trl.experimental announces itself on import
            warnings.simplefilter("ignore")
            from trl.experimental.utils import create_reference_model
        ref = create_reference_model(model)
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
