"""Where a model's files are: Hub names and local paths, GGUF files converted into the cache, weights and LoRA adapter
folders.

What both :mod:`alea_trl.modeling_alea` (``AleaModel.from_pretrained`` / ``from_backbone``) and :mod:`alea_trl.loading`
need to find a model's files; it knows nothing of ``AleaModel``, so both import it and it imports neither.
``alea_trl.loading`` re-exports every name.

Design decisions:
1. A name meant as a local path (not a valid Hub id, or its first directory exists here) that does not exist fails at
   once, naming it, instead of being looked up on the Hub with retries.
2. A GGUF file (``model=".../x.gguf"``) goes through transformers' own GGUF loader (the ``gguf`` package) once: the
   de-quantized weights are rebuilt as a plain decoder (the loaded one refuses ``save_pretrained``) and saved with the
   file's tokenizer as an ordinary checkpoint in the cache (``$ALEA_TRL_CACHE``, else ``~/.cache/alea_trl``), keyed by
   the file's content. Every later use, LoRA bases and tokenizers included, reads that folder, which loads in seconds.
3. A LoRA output's frozen backbone with random weights is kept inside the output, in :data:`BASE_BACKBONE_DIR`.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import torch
from transformers.utils import (
    ADAPTER_CONFIG_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    find_adapter_config_file,
)


BASE_BACKBONE_DIR = "base_backbone"
"""Where a LoRA output keeps its frozen backbone when that backbone had random weights (no other copy exists)."""

# from_pretrained's keyword arguments that say where files come from (the rest shape the model)
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "proxies", "subfolder")


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


__all__ = [
    "BASE_BACKBONE_DIR",
    "cache_root",
    "check_model_path",
    "convert_gguf",
    "file_sha256",
    "gguf_checkpoint",
    "has_weights",
    "hub_kwargs",
    "is_adapter_folder",
    "is_complete_checkpoint",
    "is_gguf",
    "resolve_gguf",
    "torch_dtype",
]
