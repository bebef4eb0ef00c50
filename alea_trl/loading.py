"""Loading Alea models by name: one builder for the trainer and the recipes, LoRA outputs, clear errors for paths.

Design decisions:
1. :func:`load_model` is the one place that turns a ``model_name_or_path`` into a model: an Alea checkpoint (full, or
   a LoRA output) is loaded; a plain decoder gets fresh heads (``AleaModel.from_backbone``); with
   ``init_from_config`` the decoder is built from its config with random weights. A directory holding a config but no
   weights is refused with the way to start from random weights, instead of failing inside transformers.
2. A name meant as a local path (not a valid Hub id, or its first directory exists here) that does not exist fails at
   once, naming it, instead of being looked up on the Hub with retries.
3. A LoRA output is a peft adapter folder with the Alea ``config.json`` beside it, and ``adapter_config.json`` names
   its base: the Alea checkpoint the run started from, or the pretrained backbone (heads and extras are saved in the
   adapter as ``modules_to_save``, so fresh heads around that backbone are an exact base). A backbone with random
   weights has no other copy, so the run saves it in the folder itself (``base_backbone/``) and names that.
4. A GGUF file (``model=".../x.gguf"``) goes through transformers' own GGUF loader (the ``gguf`` package) once: the
   de-quantized weights are rebuilt as a plain decoder (the loaded one refuses ``save_pretrained``) and saved with the
   file's tokenizer as an ordinary checkpoint in the cache (``$ALEA_TRL_CACHE``, else ``~/.cache/alea_trl``), keyed by
   the file's content. Every later use, LoRA bases and tokenizers included, reads that folder, which loads in seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil

import torch
from transformers import AutoConfig
from transformers.utils import (
    ADAPTER_CONFIG_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    find_adapter_config_file,
)

from .configuration_alea import EXTRA_EMBEDDINGS, AleaConfig


BASE_BACKBONE_DIR = "base_backbone"
"""Where a LoRA output keeps its frozen backbone when that backbone had random weights (no other copy exists)."""

# from_pretrained's keyword arguments that say where files come from (the rest shape the model)
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "proxies", "subfolder")
# the AleaConfig fields that shape the heads and extras (the rest describe the backbone)
_HEAD_FIELDS = ("max_score_bins", "taus", "ngram_buckets", "initializer_range", *EXTRA_EMBEDDINGS)


def cache_root() -> str:
    """Where converted checkpoints live: ``$ALEA_TRL_CACHE``, else ``$XDG_CACHE_HOME/alea_trl``, else
    ``~/.cache/alea_trl``."""
    if os.environ.get("ALEA_TRL_CACHE"):
        return os.path.abspath(os.path.expanduser(os.environ["ALEA_TRL_CACHE"]))
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "alea_trl")


def is_gguf(name_or_path) -> bool:
    """Whether ``name_or_path`` names a GGUF file (by its ``.gguf`` suffix)."""
    return isinstance(name_or_path, (str, os.PathLike)) and os.fspath(name_or_path).lower().endswith(".gguf")


def is_complete_checkpoint(path: str) -> bool:
    """Whether ``path`` holds a decoder config, its weights and a tokenizer (what :func:`convert_gguf` writes)."""
    return (
        os.path.isfile(os.path.join(path, "config.json"))
        and has_weights(path)
        and os.path.isfile(os.path.join(path, "tokenizer_config.json"))
    )


def convert_gguf(gguf_path, output_dir, dtype=torch.float32) -> str:
    """Turn a GGUF file into an ordinary transformers checkpoint (config, safetensors weights, tokenizer).

    transformers' loader de-quantizes the file into a causal LM marked as GGUF-quantized, which ``save_pretrained``
    refuses; the same weights in a plain model of the same config (without ``quantization_config``) save normally.
    The folder is written beside ``output_dir`` and moved into place when complete, so an interrupted conversion
    leaves nothing that looks finished.

    Args:
        gguf_path (`str` or `os.PathLike`): the ``.gguf`` file (any architecture transformers' GGUF loader reads).
        output_dir (`str` or `os.PathLike`): the checkpoint folder to create (replaced if it exists).
        dtype (`torch.dtype`, defaults to `torch.float32`): the dtype of the saved weights.

    Returns:
        `str`: ``output_dir``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import is_gguf_available

    gguf_path, output_dir = os.fspath(gguf_path), os.fspath(output_dir)
    if not os.path.isfile(gguf_path):
        raise ValueError(f"convert_gguf: field 'gguf_path': {gguf_path!r} is not a file")
    if not is_gguf_available():
        raise ImportError(
            'convert_gguf: reading a GGUF file needs the gguf package: pip install -e ".[gguf]" (or pip install gguf)'
        )
    folder, name = os.path.split(os.path.abspath(gguf_path))
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = ""
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    partial = f"{output_dir.rstrip(os.sep)}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(output_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(output_dir)), exist_ok=True)
    os.replace(partial, output_dir)
    return output_dir


def file_sha256(path: str) -> str:
    """The SHA-256 hex digest of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_checkpoint(gguf_path) -> str:
    """The cached ordinary checkpoint of a GGUF file (see :func:`convert_gguf`), converted on first use.

    The folder is ``<cache_root()>/gguf/<file stem>-<first 16 hex digits of the file's SHA-256>``, so a changed file
    gets a new conversion and a copy of the same file reuses it.
    """
    path = os.fspath(gguf_path)
    if not os.path.isfile(path):
        raise ValueError(f"gguf_checkpoint: field 'gguf_path': {path!r} is not a file")
    stem = os.path.splitext(os.path.basename(path))[0]
    output_dir = os.path.join(cache_root(), "gguf", f"{stem}-{file_sha256(path)[:16]}")
    if not is_complete_checkpoint(output_dir):
        convert_gguf(path, output_dir)
    return output_dir


def resolve_gguf(name_or_path):
    """``name_or_path`` itself, or for a GGUF file its cached ordinary checkpoint (:func:`gguf_checkpoint`)."""
    return gguf_checkpoint(name_or_path) if is_gguf(name_or_path) else name_or_path


def hub_kwargs(kwargs: dict) -> dict:
    """The keyword arguments of ``kwargs`` that say where files come from (revision, token, cache, ...)."""
    return {k: v for k, v in kwargs.items() if k in _HUB_KWARGS}


def check_model_path(name_or_path, who: str = "AleaModel", field: str = "model_name_or_path") -> str:
    """``name_or_path`` as a string; a name meant as a local path that does not exist raises `ValueError` at once.

    A name is meant as a local path when it is not a valid Hub id (``./x``, ``/abs/x``, ``a/b/c``) or when its first
    directory exists here (``runs/missing`` while ``runs/`` exists).
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    name = os.fspath(name_or_path)
    if os.path.exists(name):
        return name
    try:
        validate_repo_id(name)
        local = "/" in name and os.path.isdir(name.split("/")[0])
    except HFValidationError:
        local = True
    if local:
        raise ValueError(f"{who}: field '{field}': {name!r} does not exist (no such path: {os.path.abspath(name)})")
    return name


def has_weights(path: str) -> bool:
    """Whether the local directory ``path`` holds model weights (single file or sharded, safetensors or torch)."""
    names = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    return any(os.path.isfile(os.path.join(path, n)) for n in names)


def is_adapter_folder(name_or_path: str, **kwargs) -> bool:
    """Whether ``name_or_path`` (a local directory or Hub id) is a peft adapter without full model weights."""
    if (kwargs.get("adapter_kwargs") or {}).get("_adapter_model_path"):  # AutoModel found it already
        return True
    if os.path.isfile(name_or_path):  # a single file (a GGUF checkpoint) is never an adapter folder
        return False
    if os.path.isdir(name_or_path):
        return os.path.isfile(os.path.join(name_or_path, ADAPTER_CONFIG_NAME)) and not has_weights(name_or_path)
    return find_adapter_config_file(name_or_path, **hub_kwargs(kwargs)) is not None


def torch_dtype(dtype, default=torch.float32):
    """A ``torch.dtype`` from a dtype, its name (``"bfloat16"``) or ``None`` / ``"auto"`` (``default``)."""
    if dtype is None or dtype == "auto":
        return default
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


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
    from .modeling_alea import AleaModel

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


def load_adapter_model(path: str, **kwargs):
    """A LoRA output (see the module docstring) as a `peft.PeftModel` around its base `AleaModel`."""
    from peft import PeftConfig, PeftModel

    from .modeling_alea import AleaModel

    where = hub_kwargs(kwargs)
    config = AleaConfig.from_pretrained(path, **where)
    base = PeftConfig.from_pretrained(path, **where).base_model_name_or_path
    if not base:
        raise ValueError(
            f"AleaModel.from_pretrained: {path} is a LoRA adapter whose adapter_config.json names no base model; build "
            f"the base AleaModel yourself and load the adapter with peft.PeftModel.from_pretrained(base, {path!r})"
        )
    dtype = torch_dtype(kwargs.get("dtype"), default=torch_dtype(config.dtype))
    heads = {name: getattr(config, name) for name in _HEAD_FIELDS}
    # a run may have kept only the first layers of its pretrained base (num_hidden_layers in model_init_kwargs)
    depth = {"num_hidden_layers": config.get_text_config().num_hidden_layers}
    if base == BASE_BACKBONE_DIR:  # the run's own copy of a random backbone, inside the output
        local = os.path.isdir(path)
        source, sub = (os.path.join(path, base), {}) if local else (path, {**where, "subfolder": base})
        model = AleaModel.from_backbone(source, backbone_kwargs={"dtype": dtype, **sub, **depth}, **heads)
    elif AutoConfig.from_pretrained(check_model_path(base, "AleaModel.from_pretrained", "base")).model_type == "alea":
        model = AleaModel.from_pretrained(base, dtype=dtype)
    else:
        model = AleaModel.from_backbone(base, backbone_kwargs={"dtype": dtype, **depth}, **heads)
    return PeftModel.from_pretrained(model, path, **where)


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
