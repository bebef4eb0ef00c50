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

The shared trunk (``heads`` / ``tail`` modes):
4. In ``heads`` and ``tail`` modes the decoder layers below the trained tail are frozen, so the policy and its frozen
   reference compute identical hidden states up to the first trained layer. The rollout forward of the policy
   captures the input of that layer (a forward pre-hook, with its keyword arguments: mask, positions, rotary
   embeddings), and the reference runs only its own copy of the tail, its final norm and its choice head from there.
5. ``heads`` mode shares the whole trunk: the capture point is the final norm's input.
6. The same capture serves the loss forward when actions are sampled from it (``sample_in_loss_forward``): the
   policy's forward runs with autograd, the reference's tail without.
7. Sharing needs the reference to be a plain module (not sharded by DeepSpeed / FSDP) and the input-side extras to be
   off (they train, so the trunk's input would differ). Otherwise the trainer runs the full reference forward.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn
from transformers.integrations import is_deepspeed_zero3_enabled
from trl.models import prepare_deepspeed, prepare_fsdp

from ...collate import PackedBatch
from ...configuration_alea import EXTRA_EMBEDDINGS
from ...modeling_alea import AleaModel, group_option_logits
from ..model_setup import decoder_layers


def final_norm(backbone: nn.Module) -> nn.Module:
    """The backbone's final norm (``norm`` in Qwen / Llama, ``ln_f`` in GPT-2): its child module named like a norm."""
    norms = [m for name, m in backbone.named_children() if "norm" in type(m).__name__.lower() or name == "ln_f"]
    if len(norms) != 1:
        raise ValueError(f"cannot identify the final norm of {type(backbone).__name__}")
    return norms[0]


def first_shared_layer(model: AleaModel, train_mode: str, tail_k: int) -> int | None:
    """Index of the first layer the reference must run itself (== n_layers in heads mode); ``None`` when the trunk
    is not shared (full / lora modes, or input-side extras)."""
    if train_mode not in ("heads", "tail"):
        return None
    if any(getattr(model, name, None) is not None for name in EXTRA_EMBEDDINGS.values()):
        return None
    n = len(decoder_layers(model.backbone)[1])
    return n if train_mode == "heads" else max(n - tail_k, 0)


@contextlib.contextmanager
def captured_trunk(policy: AleaModel, first_layer: int):
    """Record, during the policy forwards inside this block, the input of layer ``first_layer`` (the final norm's
    when ``first_layer == n_layers``) with its keyword arguments. Yields the dict it fills (``args``, ``kwargs``)."""
    _, layers = decoder_layers(policy.backbone)
    target = layers[first_layer] if first_layer < len(layers) else final_norm(policy.backbone)
    captured: dict = {}

    def hook(module, args, kwargs):
        captured.setdefault("args", args)  # the first call (gradient checkpointing re-runs the layer in backward)
        captured.setdefault("kwargs", kwargs)

    handle = target.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield captured
    finally:
        handle.remove()


@torch.no_grad()
def reference_choice_logits(
    reference: AleaModel, captured: dict, batch: PackedBatch, first_layer: int
) -> torch.Tensor:
    """The reference's ``choice_logits`` `(NQ, max_options)` from a captured trunk: its own layers from
    ``first_layer`` on, its final norm and its choice head."""
    hidden, rest, kwargs = captured["args"][0].detach(), captured["args"][1:], captured["kwargs"]
    _, ref_layers = decoder_layers(reference.backbone)
    for layer in ref_layers[first_layer:]:
        out = layer(hidden, *rest, **kwargs)
        hidden = out[0] if isinstance(out, tuple) else out
    hidden = final_norm(reference.backbone)(hidden)  # (B, L, H)
    o_hidden = hidden[batch.option_index[:, 0], batch.option_index[:, 1]]  # (NO, H)
    ref_option_logits = reference.choice_head(o_hidden).squeeze(-1).float()  # (NO,)
    n_q = batch.question_index.shape[0]
    return group_option_logits(ref_option_logits, batch.option_question, n_q)


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


__all__ = [
    "build_reference",
    "captured_trunk",
    "final_norm",
    "first_shared_layer",
    "is_peft_model",
    "reference_choice_logits",
    "reference_policy",
]
