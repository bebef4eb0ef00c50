"""What ``GRPOTrainer.__init__`` assumes of a text language model, satisfied for a head model.

Design decisions:
1. The parent ``__init__`` is called (it sets up PEFT, DeepSpeed, FSDP, gradient checkpointing, metrics and
   logging) behind guards, rather than skipped: ``Trainer.__init__`` alone would tie the trainer to more private
   attribute names.
2. It needs a reward source: a placeholder that is never called (rewards come from the envs).
3. It writes ``model.generation_config``: one is lent for its duration.
4. With ``beta != 0`` it rebuilds the reference from ``config._name_or_path``, which fails for an in-memory or custom
   model: it sees ``beta == 0`` and the reference is built afterwards from the model itself.
5. It patches ``model.forward`` with a fused LM-head forward stored on the instance: a copy of the patched model would
   run the policy's weights, and a head model has no LM head. The patch is removed.
"""

from __future__ import annotations

import contextlib

from transformers import GenerationConfig


def rewards_come_from_envs(*args, **kwargs):
    """The placeholder reward function ``GRPOTrainer.__init__`` requires; never called."""
    raise RuntimeError("AleaEnvGRPOTrainer takes its rewards from the environments; this placeholder is never called")


@contextlib.contextmanager
def grpo_init_guards(model, args):
    """For the duration of ``GRPOTrainer.__init__``: a generation config on ``model`` and ``args.beta == 0``."""
    beta, had_config = args.beta, getattr(model, "generation_config", None) is not None
    if not had_config:
        model.generation_config = GenerationConfig()
    args.beta = 0.0
    try:
        yield
    finally:
        args.beta = beta
        if not had_config:
            del model.generation_config


def undo_fused_lm_head(model) -> None:
    """Remove the instance-level ``forward`` GRPOTrainer stored on ``model`` (unwrapped) and on its peft base."""
    for m in (model, getattr(model, "get_base_model", lambda: None)()):
        if m is not None and "forward" in m.__dict__:
            del m.__dict__["forward"]


__all__ = ["grpo_init_guards", "rewards_come_from_envs", "undo_fused_lm_head"]
