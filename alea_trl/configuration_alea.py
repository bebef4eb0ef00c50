"""AleaConfig: the configuration of an ``AleaModel``, a decoder backbone's config plus the head settings.

Design decisions:
1. The backbone's config is nested as ``text_config`` (the transformers convention for composite models), so a
   checkpoint is one ``config.json`` and loads with ``AutoConfig`` after ``import alea_trl``.
2. ``backbone_name_or_path`` records where the backbone's pretrained weights came from, so a checkpoint names its base
   (model card, LoRA reload, tokenizer) even when the model was built in memory.
3. Configs saved before the n-gram extras were named after their n (``use_ngram`` / ``use_ngram2``) still load.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .questions import TAUS


EXTRA_EMBEDDINGS = {"use_aux_embed": "aux_embed", "use_bigram": "bigram", "use_trigram": "trigram"}
"""The input-side extras: config switch -> module name."""

# extras saved before they were named after their n (config switches, weight names)
_LEGACY_SWITCHES = {"use_ngram": "use_bigram", "use_ngram2": "use_trigram"}
_LEGACY_KEYS = {r"^ngram2\.": "trigram.", r"^ngram\.": "bigram."}


@strict
class AleaConfig(PreTrainedConfig):
    r"""Configuration of an [`AleaModel`]: the backbone's config plus the head settings.

    Args:
        text_config (`dict` or `PreTrainedConfig`, *optional*):
            Config of the decoder backbone (any model type ``AutoModel`` knows). Defaults to a Qwen3 config.
        max_score_bins (`int`, *optional*, defaults to 32):
            Width of the score head; a score question uses its first ``n_bins`` logits.
        taus (`list[float]`, *optional*, defaults to `TAUS`):
            Quantile levels of the regress head.
        use_aux_embed (`bool`, *optional*, defaults to `False`):
            Add learned segment-role embeddings (state / question / option), zero-initialised.
        use_bigram (`bool`, *optional*, defaults to `False`):
            Add a hashed bigram embedding table to the token embeddings, zero-initialised.
        use_trigram (`bool`, *optional*, defaults to `False`):
            Add a hashed trigram embedding table to the token embeddings, zero-initialised.
        ngram_buckets (`int`, *optional*, defaults to 16384):
            Rows of each hashed n-gram table.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Std of the normal initialisation of the heads.
        backbone_name_or_path (`str`, *optional*):
            Hub id or local directory whose pretrained weights the backbone started from (set by
            [`AleaModel.from_backbone`]); `None` for a backbone built from a config with random weights. Model cards
            name it as the base, LoRA outputs reload their base from it, and the trainer loads the tokenizer from it.
    """

    model_type = "alea"
    sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="qwen3")}

    text_config: dict | PreTrainedConfig | None = None
    max_score_bins: int = 32
    taus: list[float] | tuple[float, ...] = TAUS
    use_aux_embed: bool = False
    use_bigram: bool = False
    use_trigram: bool = False
    ngram_buckets: int = 16384
    initializer_range: float = 0.02
    backbone_name_or_path: str | None = None

    def __post_init__(self, **kwargs):
        for old, new in _LEGACY_SWITCHES.items():  # configs saved before the switches were renamed
            if kwargs.pop(old, False):
                setattr(self, new, True)
        super().__post_init__(**kwargs)
        self.taus = [float(t) for t in self.taus]
        if any(not 0.0 < t < 1.0 for t in self.taus) or self.taus != sorted(self.taus):
            raise ValueError(f"AleaConfig: field 'taus': must be increasing levels in (0, 1), got {self.taus}")
        if self.max_score_bins < 2:
            raise ValueError(f"AleaConfig: field 'max_score_bins': must be >= 2, got {self.max_score_bins}")

    @property
    def hidden_size(self) -> int:
        return self.text_config.hidden_size


__all__ = ["EXTRA_EMBEDDINGS", "AleaConfig"]
