"""Loading Alea models by name: one builder for the trainer and the recipes, LoRA outputs, clear errors for paths.

Design decisions:
1. :func:`load_model` is the one place that turns a ``model_name_or_path`` into a model: an Alea checkpoint (full, or
   a LoRA output) is loaded; a plain decoder gets fresh heads (``AleaModel.from_backbone``); with
   ``init_from_config`` the decoder is built from its config with random weights. A directory holding a config but no
   weights is refused with the way to start from random weights, instead of failing inside transformers.
2. Finding a model's files (names meant as local paths that fail at once, GGUF files converted once into the cache,
   weights and adapter folders) is :mod:`alea_trl.model_files`, which ``AleaModel`` uses too; its names are
   re-exported here.
3. A LoRA output is a peft adapter folder with the Alea ``config.json`` beside it, and ``adapter_config.json`` names
   its base: the Alea checkpoint the run started from, or the pretrained backbone (heads and extras are saved in the
   adapter as ``modules_to_save``, so fresh heads around that backbone are an exact base). A backbone with random
   weights has no other copy, so the run saves it in the folder itself (``base_backbone/``) and names that.
   ``AleaModel.from_pretrained`` loads one (:func:`load_adapter_model`, in :mod:`alea_trl.modeling_alea`, re-exported
   here); this module writes the parts a run saves.
"""

from __future__ import annotations

import contextlib
import json
import os

from transformers import AutoConfig
from transformers.utils import ADAPTER_CONFIG_NAME, SAFE_WEIGHTS_NAME

from .configuration_alea import EXTRA_EMBEDDINGS
from .model_files import (
    _HUB_KWARGS,
    BASE_BACKBONE_DIR,
    cache_root,
    check_model_path,
    convert_gguf,
    file_sha256,
    gguf_checkpoint,
    has_weights,
    hub_kwargs,
    is_adapter_folder,
    is_complete_checkpoint,
    is_gguf,
    resolve_gguf,
    torch_dtype,
)
from .modeling_alea import AleaModel, load_adapter_model


def check_extras(model, extras: dict | None, who: str):
    """An existing Alea model keeps its own extras: a ``use_*`` switch asking for one it lacks is an error, not a
    silent no-op."""
    for field_name, module in EXTRA_EMBEDDINGS.items():
        if (extras or {}).get(field_name) and getattr(model, module, None) is None:
            raise ValueError(
                f"{who}: field '{field_name}': the given Alea model has no {module} table and the switch only shapes "
                f"new models built from a backbone; build the model with AleaModel.from_backbone(..., "
                f"{field_name}=True) or set {field_name}=False"
            )
    return model


def model_init_kwargs_from(model_args, base: dict | None = None) -> dict:
    """``from_pretrained`` keyword arguments from TRL's ``ModelConfig`` (``model_revision``, ``dtype``,
    ``attn_implementation``) over ``base`` (e.g. a config's ``model_init_kwargs``)."""
    kwargs = {**(base or {}), "revision": model_args.model_revision}
    for key in ("dtype", "attn_implementation"):
        if getattr(model_args, key, None):
            kwargs[key] = getattr(model_args, key)
    return kwargs


def load_model(
    name_or_path,
    *,
    init_from_config: bool = False,
    model_init_kwargs: dict | None = None,
    extras: dict | None = None,
    who: str = "load_model",
    field: str = "model_name_or_path",
):
    """The model a trainer or recipe starts from (see the module docstring).

    Args:
        name_or_path (`str` or `os.PathLike`): an Alea checkpoint or LoRA output, or a plain decoder (Hub id, local
            directory, or a ``.gguf`` file: converted once into the cache, see :func:`gguf_checkpoint`).
        init_from_config (`bool`, defaults to `False`): build the decoder from its config with random weights.
        model_init_kwargs (`dict`, *optional*): ``from_pretrained`` keyword arguments (``dtype``,
            ``attn_implementation``, ``revision``, ...); a config-built decoder takes all but the file-location ones,
            with ``dtype`` ``"auto"`` or unset meaning float32.
        extras (`dict`, *optional*): ``use_aux_embed`` / ``use_bigram`` / ``use_trigram`` of a new model; asking an
            existing Alea checkpoint for an extra it lacks raises.
        who (`str`), field (`str`): named in error messages (the class or script, and its argument).

    Returns:
        `AleaModel`, or a `peft.PeftModel` around one for a LoRA output.
    """
    path = resolve_gguf(check_model_path(name_or_path, who, field))
    kwargs = dict(model_init_kwargs or {})
    config = AutoConfig.from_pretrained(path, **hub_kwargs(kwargs), trust_remote_code=kwargs.get("trust_remote_code"))
    if config.model_type == "alea":
        if init_from_config:
            raise ValueError(
                f"{who}: field 'init_from_config': {path} is an Alea checkpoint, not a decoder whose config builds a "
                "random backbone; set init_from_config false to start from its weights"
            )
        return check_extras(AleaModel.from_pretrained(path, **kwargs), extras, who)
    extras = dict(extras or {})
    if init_from_config:
        backbone_kwargs = {k: v for k, v in kwargs.items() if k not in _HUB_KWARGS}
        backbone_kwargs["dtype"] = torch_dtype(backbone_kwargs.get("dtype"))
        return AleaModel.from_backbone(config, backbone_kwargs=backbone_kwargs, **extras)
    if os.path.isdir(path) and not has_weights(path):
        raise ValueError(
            f"{who}: field '{field}': {path} holds a {config.model_type} config but no weights; to start from random "
            f"weights build the backbone from the config (AleaModel.from_backbone(AutoConfig.from_pretrained({path!r}))"
            ", or init_from_config: true in the recipes)"
        )
    return AleaModel.from_backbone(path, backbone_kwargs=kwargs, **extras)


def lora_base(model) -> str | None:
    """What a LoRA output of ``model`` (the ``AleaModel`` under the adapter) names as its base: the Alea checkpoint it
    was loaded from, else its pretrained backbone; ``None`` when the backbone had random weights."""
    return model.config._name_or_path or model.config.backbone_name_or_path or None


def record_lora_base(output_dir: str, base: str) -> None:
    """Name ``base`` in the ``adapter_config.json`` peft wrote to ``output_dir`` (peft names the model's own path,
    empty for a model built around a backbone). Written after the save, so peft's check of the base's vocabulary does
    not look a backbone up on the Hub at every save."""
    path = os.path.join(output_dir, ADAPTER_CONFIG_NAME)
    with open(path, encoding="utf-8") as f:
        adapter_config = json.load(f)
    adapter_config["base_model_name_or_path"] = base
    with open(path, "w", encoding="utf-8") as f:
        json.dump(adapter_config, f, indent=2, sort_keys=True)


def frozen_backbone_state(backbone) -> dict:
    """The frozen weights of a LoRA-wrapped backbone as a plain decoder's state dict (adapters left out).

    Under DeepSpeed ZeRO-3 the weights are gathered from every rank, so every rank must call it.
    """
    partitioned = [p for p in backbone.parameters() if hasattr(p, "ds_id")]
    with gathered_parameters(partitioned):
        return {
            name.replace(".base_layer.", "."): tensor.detach().clone()
            for name, tensor in backbone.state_dict().items()
            if "lora_" not in name
        }


def gathered_parameters(params: list):
    """DeepSpeed's ``GatheredParameters`` over ZeRO-3 partitioned ``params`` (read only); a no-op for none."""
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def save_frozen_backbone(state: dict, config, output_dir: str) -> None:
    """Save a backbone's weights (:func:`frozen_backbone_state`) with its config as a plain decoder checkpoint that
    ``AutoModel.from_pretrained`` loads. Written directly rather than through a model built for it, which under
    ZeRO-3 would be built partitioned, a collective that only the saving rank would enter."""
    from safetensors.torch import save_file

    os.makedirs(output_dir, exist_ok=True)
    config.save_pretrained(output_dir)
    save_file(
        {k: v.contiguous() for k, v in state.items()}, os.path.join(output_dir, SAFE_WEIGHTS_NAME), {"format": "pt"}
    )


__all__ = [
    "BASE_BACKBONE_DIR",
    "cache_root",
    "check_extras",
    "check_model_path",
    "convert_gguf",
    "file_sha256",
    "frozen_backbone_state",
    "gguf_checkpoint",
    "has_weights",
    "is_complete_checkpoint",
    "is_gguf",
    "is_adapter_folder",
    "load_adapter_model",
    "load_model",
    "lora_base",
    "model_init_kwargs_from",
    "record_lora_base",
    "resolve_gguf",
    "save_frozen_backbone",
    "torch_dtype",
]
