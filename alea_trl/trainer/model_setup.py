"""Model-side set-up of the trainer: resolving the ``model`` argument, ``train_mode`` freezing, LoRA, optimizer groups.

Design decisions:
1. ``model`` may be a backbone id or path (fresh heads via ``AleaModel.from_backbone``), an Alea checkpoint (loaded
   with ``from_pretrained``: training continues from it), or an ``AleaModel``: ``alea_trl.loading.load_model``
   builds it, as it does for the recipes.
2. ``tail`` trains the last ``tail_k`` decoder layers and everything after them (the final norm), never the token
   embeddings; the heads and the extras always train.
3. ``lora`` puts LoRA adapters (peft) on every linear layer of the last ``tail_k`` decoder layers and trains the heads
   and extras fully (``modules_to_save``); with the adapter disabled the model is exactly the initial policy, which
   is then the reference.
4. Three optimizer groups: heads at ``lr_head``, backbone (or adapters) at ``learning_rate``, extras at ``lr_aux``.

Half precision:
5. AdamW's update of a weight near 1 at a learning rate of 5e-6 is ~5e-6, far below bfloat16's resolution there
   (2^-7, about 0.008): with bfloat16 parameters and a plain torch optimizer most updates round to nothing (after 3
   steps of the 0.6B recipe at its learning rates, 8% of ``down_proj`` elements and no ``norm.weight`` had moved).
   TRL's recipes load float32 weights and train under bfloat16 autocast (``bf16: true``); this warns, once per
   trainer, when a run does otherwise.
6. DeepSpeed keeps float32 master weights of half-precision parameters itself: no warning there.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from transformers import AutoTokenizer

from ..configuration_alea import EXTRA_EMBEDDINGS
from ..loading import check_extras, load_model
from ..model_files import check_model_path, hub_kwargs, is_adapter_folder, resolve_gguf
from ..modeling_alea import AleaModel


HEADS = ("choice_head", "score_head", "noul_head", "regress_head")
EXTRAS = tuple(EXTRA_EMBEDDINGS.values())


def resolve_model(model, args) -> AleaModel:
    """An ``AleaModel`` from the trainer's ``model`` argument (see the module docstring), checked against ``args``:
    the extras it asks for and ``max_len`` (at most the backbone's positions)."""
    who = "AleaEnvGRPOTrainer"
    if isinstance(model, str):
        if is_adapter_folder(check_model_path(model, who, "model"), **hub_kwargs(args.model_init_kwargs or {})):
            raise ValueError(
                f"{who}: field 'model': {model} is a LoRA adapter; merge it into a full checkpoint first "
                "(AleaModel.from_pretrained(path).merge_and_unload().save_pretrained(new_path)) and pass that"
            )
        init_kwargs = args.model_init_kwargs
        model = load_model(model, model_init_kwargs=init_kwargs, extras=extra_switches(args), who=who, field="model")
    elif not isinstance(model, AleaModel):
        raise ValueError(f"{who}: field 'model': expected a model id or path, or an AleaModel, got {type(model)}")
    check_extras(model, extra_switches(args), who)
    model.decision_len_limit(args.max_len)
    return model


def resolve_tokenizer(model: AleaModel, processing_class, args, model_arg):
    """The trainer's tokenizer: ``processing_class`` when given, else loaded (as TRL does: the model's revision and
    ``trust_remote_code``) from where the model came from: the ``model`` path, the Alea checkpoint, the pretrained
    backbone, or the directory whose config built the backbone. A model with none of these raises `ValueError`."""
    if processing_class is not None:
        return processing_class
    from_path = isinstance(model_arg, str)
    source = (
        (resolve_gguf(model_arg) if from_path else None)  # a .gguf file's tokenizer is in its cached checkpoint
        or model.config._name_or_path
        or model.config.backbone_name_or_path
        or model.config.get_text_config()._name_or_path
    )
    if not source:
        raise ValueError(
            "AleaEnvGRPOTrainer: field 'processing_class': the model was built in memory from a config, so there is "
            "no path to load its tokenizer from; pass processing_class=AutoTokenizer.from_pretrained(...)"
        )
    init_kwargs = args.model_init_kwargs or {}
    return AutoTokenizer.from_pretrained(
        source,
        revision=init_kwargs.get("revision") if from_path else None,
        trust_remote_code=init_kwargs.get("trust_remote_code", args.trust_remote_code),
    )


def extra_switches(args) -> dict[str, bool]:
    """The input-side extras a config (``AleaEnvGRPOConfig`` or a script's arguments) asks new models to have."""
    return {switch: getattr(args, switch) for switch in EXTRA_EMBEDDINGS}


def decoder_layers(backbone: nn.Module) -> tuple[str, nn.ModuleList]:
    """The name and the ``ModuleList`` of the backbone's decoder layers (``layers`` for Qwen/Llama, ``h`` for GPT-2)."""
    n_layers = backbone.config.num_hidden_layers
    for name, module in backbone.named_children():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return name, module
    raise ValueError(f"cannot find the decoder layers of {type(backbone).__name__}: no ModuleList of {n_layers}")


def apply_train_mode(model: AleaModel, train_mode: str, tail_k: int) -> None:
    """Set ``requires_grad`` for ``heads``, ``tail`` and ``full`` (``lora`` is handled by peft)."""
    layers_name, layers = decoder_layers(model.backbone)
    first_trained = max(len(layers) - tail_k, 0)
    for name, param in model.backbone.named_parameters():
        if train_mode == "full":
            param.requires_grad_(True)
        elif train_mode == "tail":
            param.requires_grad_(_in_tail(name, layers_name, first_trained, model.backbone))
        else:
            param.requires_grad_(False)
    for module in _heads_and_extras(model):
        module.requires_grad_(True)


def _in_tail(param_name: str, layers_name: str, first_trained: int, backbone: nn.Module) -> bool:
    parts = param_name.split(".")
    if parts[0] == layers_name:
        return int(parts[1]) >= first_trained
    owner = backbone.get_submodule(".".join(parts[:-1])) if len(parts) > 1 else backbone
    return not isinstance(owner, nn.Embedding)  # the final norm trains, the embeddings do not


def _heads_and_extras(model: AleaModel) -> list[nn.Module]:
    return [getattr(model, n) for n in HEADS + EXTRAS if getattr(model, n, None) is not None]


def lora_config(model: AleaModel, args, base=None):
    """A peft ``LoraConfig`` on the linear layers of the last ``tail_k`` decoder layers, heads and extras trained.

    Args:
        model (`AleaModel`): the model to adapt.
        args: the trainer config (``tail_k``).
        base (`peft.LoraConfig`, *optional*): a user's config; its rank, alpha, dropout, rslora / dora switches and
            target modules (when set) are kept, the layer selection and ``modules_to_save`` are completed.
    """
    import dataclasses

    from peft import LoraConfig
    from transformers.pytorch_utils import Conv1D

    layers_name, layers = decoder_layers(model.backbone)
    targets = sorted(
        {name.split(".")[-1] for name, module in layers.named_modules() if isinstance(module, (nn.Linear, Conv1D))}
    )
    n = len(layers)
    kept = {}
    if base is not None:
        if not isinstance(base, LoraConfig):
            raise ValueError(
                f"AleaEnvGRPOTrainer: field 'peft_config': train_mode='lora' needs a LoraConfig, got {base}"
            )
        kept = {
            f.name: getattr(base, f.name)
            for f in dataclasses.fields(base)
            if f.name in ("r", "lora_alpha", "lora_dropout", "use_rslora", "use_dora")
        }
        if base.target_modules and base.target_modules != "all-linear":
            targets = sorted(base.target_modules)
    extra_saved = list(base.modules_to_save or []) if base is not None else []
    return LoraConfig(
        **{"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, **kept},
        target_modules=targets,
        layers_to_transform=list(range(max(n - args.tail_k, 0), n)),
        layers_pattern=layers_name,
        modules_to_save=sorted({*extra_saved, *(m for m in HEADS + EXTRAS if getattr(model, m, None) is not None)}),
    )


def param_groups(model: nn.Module, args, decay_names: set[str] | None = None) -> list[dict]:
    """Optimizer groups: heads at ``lr_head``, backbone / adapters at ``learning_rate``, extras at ``lr_aux``.

    With ``decay_names`` (the names ``Trainer.get_decay_parameter_names`` returns), each group is split in two, as
    ``Trainer.create_optimizer`` does: the named parameters get ``args.weight_decay``, the others (biases, norm
    weights) none. Without it every group gets ``args.weight_decay``."""
    groups: dict[tuple[str, bool], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        parts = set(name.split("."))
        kind = "heads" if parts & set(HEADS) else "extras" if parts & set(EXTRAS) else "backbone"
        decays = decay_names is None or name in decay_names
        groups.setdefault((kind, decays), []).append(param)
    lrs = {"heads": args.lr_head, "backbone": args.learning_rate, "extras": args.lr_aux}
    out = []
    for kind in ("heads", "backbone", "extras"):
        for decays in (True, False):
            if groups.get((kind, decays)):
                wd = args.weight_decay if decays else 0.0
                out.append({"params": groups[(kind, decays)], "lr": lrs[kind], "weight_decay": wd, "name": kind})
    return out


def grouped_optimizer(trainer):
    """The optimizer ``Trainer.create_optimizer`` would build (its class and kwargs from ``args``, weight decay on the
    parameters ``get_decay_parameter_names`` picks), over :func:`param_groups` instead of one learning rate."""
    decay_names = set(trainer.get_decay_parameter_names(trainer.model))
    groups = param_groups(trainer.model, trainer.args, decay_names)
    optimizer_cls, optimizer_kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    optimizer_kwargs.pop("lr", None)
    return optimizer_cls(groups, **optimizer_kwargs)


HALF = (torch.bfloat16, torch.float16)


def half_precision_trainables(model: torch.nn.Module) -> dict[torch.dtype, int]:
    """The number of trainable parameter elements per half-precision dtype."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.requires_grad and p.dtype in HALF:
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return counts


def warn_if_no_float32_master(model: torch.nn.Module, optimizer, deepspeed: bool) -> bool:
    """Warn when ``model`` has half-precision trainable parameters and ``optimizer`` updates them in place (no float32
    master copy); returns whether it warned."""
    counts = half_precision_trainables(model)
    if deepspeed or not counts:
        return False
    dtypes = ", ".join(f"{n:,} {str(d).removeprefix('torch.')}" for d, n in counts.items())
    warnings.warn(
        f"AleaEnvGRPOTrainer: the optimizer ({type(optimizer).__name__}) updates half-precision parameters in place "
        f"({dtypes} trainable elements) and keeps no float32 copy, so updates smaller than the weight's precision "
        "round to nothing and many weights never move. Load the model in float32 (recipe: `dtype: float32`; "
        "Python: `model_init_kwargs={'dtype': 'float32'}` or `AleaModel.from_pretrained(..., dtype=torch.float32)`) "
        "and train with `bf16: true` (bfloat16 autocast), as TRL's recipes do.",
        UserWarning,
        stacklevel=3,
    )
    return True


__all__ = [
    "apply_train_mode",
    "decoder_layers",
    "grouped_optimizer",
    "half_precision_trainables",
    "lora_config",
    "param_groups",
    "resolve_model",
    "resolve_tokenizer",
    "warn_if_no_float32_master",
]
