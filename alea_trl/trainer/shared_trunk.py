"""The reference policy's act logits from the policy's own forward, when the two share a frozen trunk.

Design decisions:
1. In ``heads`` and ``tail`` modes the decoder layers below the trained tail are frozen, so the policy and its frozen
   reference compute identical hidden states up to the first trained layer. The rollout forward of the policy
   captures the input of that layer (a forward pre-hook, with its keyword arguments: mask, positions, rotary
   embeddings), and the reference runs only its own copy of the tail, its final norm and its choice head from there.
2. ``heads`` mode shares the whole trunk: the capture point is the final norm's input.
3. The same capture serves the loss forward when actions are sampled from it (``sample_in_loss_forward``): the
   policy's forward runs with autograd, the reference's tail without.
4. Sharing needs the reference to be a plain module (not sharded by DeepSpeed / FSDP) and the input-side extras to be
   off (they train, so the trunk's input would differ). Otherwise the trainer runs the full reference forward.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..collate import PackedBatch
from ..configuration_alea import EXTRA_EMBEDDINGS
from ..modeling_alea import AleaModel, group_option_logits
from .model_setup import decoder_layers


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


__all__ = [
    "captured_trunk",
    "final_norm",
    "first_shared_layer",
    "reference_choice_logits",
]
