"""What ``GRPOTrainer.__init__`` assumes of a text language model, satisfied for a head model.

Design decisions:
1. The parent ``__init__`` is called (it sets up PEFT, DeepSpeed, FSDP, gradient checkpointing, metrics and
   logging) behind guards, rather than skipped: ``Trainer.__init__`` alone would tie the trainer to more private
   attribute names.
2. It needs a reward source: a placeholder that is never called (rewards come from the envs).
3. It writes ``model.generation_config``: one is lent for its duration.
4. With ``beta != 0`` it rebuilds the reference from ``config._name_or_path``, which fails for an in-memory or custom
   model: it sees ``beta == 0`` and the reference is built afterwards from the model itself. It would then refuse
   ``sync_ref_model`` (no reference with ``beta == 0``), so it sees ``sync_ref_model=False`` too, and the trainer adds
   TRL's ``SyncRefModelCallback`` once its reference exists.
5. It patches ``model.forward`` with a fused LM-head forward stored on the instance: a copy of the patched model would
   run the policy's weights, and a head model has no LM head. The patch is removed.
6. It enables a Mixture-of-Experts router loss when the backbone's config declares one (``router_aux_loss_coef``
   unset), which the Alea forward never returns: such a backbone is refused unless the field is 0.0.
7. It warns that ``model_init_kwargs`` were ignored whenever it receives a model instance; when the trainer itself
   loaded the model from a path with them, it does not see them (for a user's instance the warning stays true).
"""

from __future__ import annotations

import contextlib

from transformers import GenerationConfig


def rewards_come_from_envs(*args, **kwargs):
    """The placeholder reward function ``GRPOTrainer.__init__`` requires; never called."""
    raise RuntimeError("AleaEnvGRPOTrainer takes its rewards from the environments; this placeholder is never called")


@contextlib.contextmanager
def grpo_init_guards(model, args, loaded_from_path: bool = False):
    """For the duration of ``GRPOTrainer.__init__``: a generation config on ``model``, ``args.beta == 0``,
    ``args.sync_ref_model == False``, and, when the trainer loaded ``model`` from a path with
    ``args.model_init_kwargs``, no ``model_init_kwargs`` (GRPOTrainer would warn that they were ignored)."""
    beta, sync, had_config = args.beta, args.sync_ref_model, getattr(model, "generation_config", None) is not None
    init_kwargs = args.model_init_kwargs
    if not had_config:
        model.generation_config = GenerationConfig()
    args.beta, args.sync_ref_model = 0.0, False
    if loaded_from_path:
        args.model_init_kwargs = None
    try:
        yield
    finally:
        args.beta, args.sync_ref_model, args.model_init_kwargs = beta, sync, init_kwargs
        if not had_config:
            del model.generation_config


def check_router_aux_loss(model, args) -> None:
    """Refuse a Mixture-of-Experts backbone whose config weights a router load-balancing loss while
    ``router_aux_loss_coef`` is unset: GRPOTrainer would take the backbone's coefficient, but the Alea forward returns
    no router logits, so the term would be silently missing (the config refuses other values than 0.0)."""
    text_config = model.config.get_text_config()
    coef = getattr(text_config, "router_aux_loss_coef", 0.0)
    if hasattr(text_config, "output_router_logits") and args.router_aux_loss_coef is None and coef:
        raise ValueError(
            f"AleaEnvGRPOTrainer: field 'router_aux_loss_coef': the backbone ({text_config.model_type}) is a "
            f"Mixture-of-Experts model whose config weights a router load-balancing loss by {coef}, but the Alea "
            "forward does not return router logits, so that loss cannot be added; set router_aux_loss_coef=0.0 to "
            "train without it"
        )


def undo_fused_lm_head(model) -> None:
    """Remove the instance-level ``forward`` GRPOTrainer stored on ``model`` (unwrapped) and on its peft base."""
    for m in (model, getattr(model, "get_base_model", lambda: None)()):
        if m is not None and "forward" in m.__dict__:
            del m.__dict__["forward"]


__all__ = ["check_router_aux_loss", "grpo_init_guards", "rewards_come_from_envs", "undo_fused_lm_head"]
