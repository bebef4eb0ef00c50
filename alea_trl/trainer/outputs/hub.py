"""What the Alea trainers (GRPO and SFT) leave behind: the model card, LoRA outputs that name their base, and pushes
that save locally first and fail in one message when the Hub cannot be reached.

Design decisions:
1. ``push_to_hub`` saves the final model, its tokenizer and the card in ``output_dir`` before any network call, so a
   failed push loses nothing; ``Trainer.push_to_hub`` (which creates the repo, saves again and uploads) runs after.
2. A Hub that cannot be reached (connection refused, timeout, ``HF_HUB_OFFLINE``) or that refuses the push raises
   :class:`HubPushError`: one message naming the endpoint, the reason and what was saved where, instead of a long
   traceback ending in a raw connection error. With ``push_to_hub=True`` the repo is created when the trainer is
   built, so an unreachable Hub is reported then, before any training.
3. A LoRA output also gets the Alea ``config.json``, and its ``adapter_config.json`` names its base (see
   :mod:`alea_trl.loading`); a backbone with random weights is saved beside the adapter.
4. The final save of an FSDP run with sharded state dicts (``fsdp_state_dict_type: SHARDED_STATE_DICT``: fast,
   small checkpoints that a run resumes from) gathers the full state dict, as ``FULL_STATE_DICT`` would;
   ``Trainer.save_model`` would otherwise write no weights, and ``AleaModel.from_pretrained(output_dir)`` would find
   no model. Checkpoints keep the sharded format the config asked for.
5. The trainers override ``create_model_card``, ``save_model`` and ``push_to_hub`` and call the functions here with
   themselves: what they need of a trainer is its ``args``, ``accelerator``, ``model``, ``env_factories`` and, after
   an evaluation, ``last_eval_table`` / ``last_eval_settings``.
"""

from __future__ import annotations

import contextlib
import os

from torch.distributed.fsdp import StateDictType

from ...evaluation import table_metrics
from ...loading import frozen_backbone_state, lora_base, record_lora_base, save_frozen_backbone
from ...model_files import BASE_BACKBONE_DIR
from .model_card import build_model_card


class HubPushError(ConnectionError):
    """The Hub could not be reached, or refused a push; the message says what was saved locally."""


def hub_endpoint() -> str:
    """The Hub endpoint the trainer's pushes go to (``HF_ENDPOINT``, by default the public Hub)."""
    from transformers.utils.hub import hf_api

    return hf_api().endpoint


def _hub_failure(exc: BaseException) -> str | None:
    """Why a Hub call failed, in a few words, or ``None`` when ``exc`` is not a Hub or network failure."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    first_line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, OfflineModeIsEnabled):
        return f"HF_HUB_OFFLINE is set, so the Hub at {hub_endpoint()} is not contacted"
    # the HTTP client's connection errors (httpx / requests, by version) share these class names
    if {c.__name__ for c in type(exc).__mro__} & {"ConnectionError", "TransportError", "Timeout", "TimeoutError"}:
        return f"cannot reach the Hub at {hub_endpoint()} ({first_line})"
    if isinstance(exc, HfHubHTTPError):
        return f"the Hub at {hub_endpoint()} refused it ({first_line})"
    return None


@contextlib.contextmanager
def hub_errors(action: str, saved: str):
    """Turn a Hub or network failure inside the block into one :class:`HubPushError` ``"<action>: <reason>.
    <saved>"``; other errors pass through."""
    try:
        yield
    except HubPushError:
        raise
    except Exception as exc:
        reason = _hub_failure(exc)
        if reason is None:
            raise
        raise HubPushError(f"{action}: {reason}. {saved}") from None


def push_at_init(args):
    """The context for ``Trainer.__init__``, which creates the Hub repo when ``push_to_hub`` is set."""
    if not args.push_to_hub:
        return contextlib.nullcontext()
    repo = args.hub_model_id or f"a repo named after {args.output_dir}"
    return hub_errors(
        f"push_to_hub=True ({repo})",
        "Nothing was trained or saved yet: set push_to_hub false to train without the Hub, or check the network "
        "and HF_ENDPOINT",
    )


def card_repo(trainer) -> str:
    """The repo a trainer's card and pushes name: the Hub model id, else the output directory."""
    return getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id or trainer.args.output_dir


def write_model_card(trainer, method: str, model_name: str | None = None, dataset_name=None, tags=None) -> None:
    """Write the Alea model card (:func:`~alea_trl.trainer.outputs.model_card.build_model_card`) of ``trainer`` to
    ``output_dir/README.md``: base model, a quick start, the envs' questions, the last evaluation (table and
    ``model-index``), the training settings and citations. ``dataset_name`` is refused: the data are the envs."""
    if dataset_name is not None:
        raise ValueError("create_model_card: field 'dataset_name': an Alea model is trained on envs, not a dataset")
    if not trainer.is_world_process_zero():
        return
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    lora = hasattr(unwrapped, "get_base_model")
    repo = card_repo(trainer)
    card = build_model_card(
        config=(unwrapped.get_base_model() if lora else unwrapped).config,
        args=trainer.args,
        env_factories=trainer.env_factories,
        method=method,
        model_name=model_name or repo.rstrip("/").split("/")[-1],
        repo=repo,
        lora=lora,
        eval_table=getattr(trainer, "last_eval_table", None),
        eval_settings=getattr(trainer, "last_eval_settings", None),
        tags=tags,
    )
    os.makedirs(trainer.args.output_dir, exist_ok=True)
    card.save(os.path.join(trainer.args.output_dir, "README.md"))


def save_lora_extras(trainer, output_dir: str) -> None:
    """After ``Trainer.save_model``: a LoRA output also gets the Alea ``config.json`` and names its base (a backbone
    with random weights is saved beside the adapter); nothing for other models."""
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    if not hasattr(unwrapped, "get_base_model"):  # not a peft model: no LoRA output
        return
    model = unwrapped.get_base_model()
    base = lora_base(model)
    if base is None:  # random backbone weights: the adapter's base is a copy saved beside it
        base = BASE_BACKBONE_DIR
        state = frozen_backbone_state(model.backbone)  # every rank: gathered under ZeRO-3
        if trainer.args.should_save:
            save_frozen_backbone(state, model.backbone.config, os.path.join(output_dir, base))
    if trainer.args.should_save:
        record_lora_base(output_dir, base)
        model.config.save_pretrained(output_dir)


def save_evaluation(trainer, **settings) -> None:
    """Write ``eval_results.json`` (``Trainer.save_metrics``): the last evaluation's figures (``eval_<env>/<figure>``)
    and how they were played (``eval_settings/<key>``: episodes, seed, envs and the given ``settings``), so
    ``recipes/evaluate.py`` can play the same episodes again."""
    played = {**trainer.last_eval_settings, **settings}
    trainer.save_metrics(
        "eval", table_metrics(trainer.last_eval_table) | {f"eval_settings/{k}": v for k, v in played.items()}
    )


@contextlib.contextmanager
def saved_before_push(trainer, model_name: str | None = None, tags=None):
    """The context of ``Trainer.push_to_hub``: the final model, tokenizer and card are saved in ``output_dir`` first;
    a Hub that cannot be reached or refuses raises :class:`HubPushError` naming the endpoint and the saved folder."""
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    trainer.create_model_card(model_name=model_name, tags=tags)
    repo = getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id or os.path.basename(output_dir)
    saved = (
        f"The final model, its tokenizer and model card are saved in {os.path.abspath(output_dir)}; upload them "
        f"later with `hf upload {repo} {output_dir}`"
    )
    with hub_errors(f"push_to_hub ({repo})", saved):
        yield


@contextlib.contextmanager
def _full_state_dict(plugin):
    saved = plugin.state_dict_type
    plugin.state_dict_type = StateDictType.FULL_STATE_DICT
    try:
        yield
    finally:
        plugin.state_dict_type = saved


def whole_final_model(trainer, internal_call: bool):
    """The context of a ``save_model`` call: the final save of an FSDP run with sharded state dicts gathers whole
    weights (see the module docstring); checkpoints (``internal_call``) and other runs save as configured."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if internal_call or not trainer.is_fsdp_enabled or "FULL_STATE_DICT" in str(plugin.state_dict_type):
        return contextlib.nullcontext()
    return _full_state_dict(plugin)  # every process takes part in gathering the weights


__all__ = [
    "HubPushError",
    "card_repo",
    "hub_endpoint",
    "hub_errors",
    "push_at_init",
    "save_evaluation",
    "save_lora_extras",
    "saved_before_push",
    "whole_final_model",
    "write_model_card",
]
