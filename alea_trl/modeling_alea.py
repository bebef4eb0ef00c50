"""AleaModel: a decoder backbone plus four small answer heads read off packed decisions.

Design decisions:
1. Any decoder that ``transformers.AutoModel`` builds is a backbone (Qwen3 by default; Llama- and GPT-2-style work).
   Only its hidden states are used, never the LM head.
2. Heads read the hidden state of the last token of each question (score, noul, regress) and of each option
   (choice). Every head runs on every question read-out: the heads are tiny, and a forward that touches every
   parameter keeps DDP happy without ``find_unused_parameters``.
3. Regress quantiles are monotone by construction: a base plus the cumulative sum of softplus increments.
4. Input-side extras (segment-role embeddings, hashed bigram / trigram embeddings) are zero-initialised, so a
   pretrained backbone computes exactly what it did before at step 0. N-grams follow ``prev_ids`` from packing, so
   they see the same history packed and unpacked.
5. The config (``configuration_alea.py``) nests the backbone's; a checkpoint is one ``config.json`` + safetensors
   and loads with ``AutoModel.from_pretrained`` after ``import alea_trl`` (registration on import: transformers has
   no plugin entry point, and a config ``auto_map`` would need ``trust_remote_code``). A LoRA output loads through
   ``from_pretrained`` too (:func:`load_adapter_model`; the format is described in ``loading.py``).
6. A backbone handed to ``__init__`` was built (initialised or loaded) by transformers already: its modules are marked
   initialised, so ``post_init`` initialises only the heads and extras. Under DeepSpeed ZeRO-3 the heads and extras
   are built partitioned too (``zero.Init``), and initialised gathered, on rank 0, then broadcast, as transformers
   does for its own models; the backbone's partitions are never touched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.integrations import is_deepspeed_zero3_enabled
from transformers.utils import ModelOutput

from .attention import block_mask_from_segments, mask_from_segments
from .collate import collate_segments, pad_token_id
from .configuration_alea import _LEGACY_KEYS, EXTRA_EMBEDDINGS, AleaConfig
from .model_files import (
    BASE_BACKBONE_DIR,
    check_model_path,
    hub_kwargs,
    is_adapter_folder,
    resolve_gguf,
    torch_dtype,
)
from .packing import pack_request
from .questions import Decision


# the AleaConfig fields that shape the heads and extras (the rest describe the backbone)
_HEAD_FIELDS = ("max_score_bins", "taus", "ngram_buckets", "initializer_range", *EXTRA_EMBEDDINGS)


@dataclass
class AleaOutput(ModelOutput):
    """Outputs of [`AleaModel`] for a packed batch (NQ question read-outs, NO option read-outs).

    Args:
        option_logits (`torch.FloatTensor` of shape `(NO,)`): choice-head logit of every option.
        choice_logits (`torch.FloatTensor` of shape `(NQ, max_options)`): option logits grouped per question,
            ``-inf`` where a question has no such option (rows of non-choice questions are all ``-inf``).
        score_logits (`torch.FloatTensor` of shape `(NQ, max_score_bins)`): score-head logits, ``-inf`` past each score
            question's ``n_bins``.
        noul_logits (`torch.FloatTensor` of shape `(NQ,)`): noul-head logit of p_yes.
        quantiles (`torch.FloatTensor` of shape `(NQ, T)`): regress-head quantiles at ``config.taus``.
    """

    option_logits: torch.FloatTensor | None = None
    choice_logits: torch.FloatTensor | None = None
    score_logits: torch.FloatTensor | None = None
    noul_logits: torch.FloatTensor | None = None
    quantiles: torch.FloatTensor | None = None


class QuantileHead(nn.Module):
    """hidden -> ``n_taus`` non-decreasing quantiles (base + cumulative softplus increments)."""

    def __init__(self, hidden_size: int, n_taus: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, n_taus)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        raw = self.proj(hidden).float()  # (N, T)
        steps = F.softplus(raw[:, 1:])  # (N, T-1)
        return torch.cat([raw[:, :1], raw[:, :1] + steps.cumsum(-1)], dim=-1)  # (N, T)


class AleaPreTrainedModel(PreTrainedModel):
    config_class = AleaConfig
    base_model_prefix = "alea"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def _init_weights(self, module):
        extras = [getattr(self, name, None) for name in EXTRA_EMBEDDINGS.values()]
        if any(module is extra for extra in extras if extra is not None):
            init.zeros_(module.weight)  # neutral at step 0: the backbone computes what it did before
        else:
            super()._init_weights(module)


def _hash_ngram(ids: Sequence[torch.Tensor], buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bucket of the n-gram ending at each token, and whether the whole n-gram exists (no -1 in it)."""
    valid = torch.ones_like(ids[0], dtype=torch.bool)
    h = torch.zeros_like(ids[0])
    for t in ids:
        valid &= t >= 0
        h = (h * 1_000_003 + t.clamp(min=0)) % buckets
    return h, valid


def group_option_logits(option_logits: torch.Tensor, option_question: torch.Tensor, n_questions: int) -> torch.Tensor:
    """Scatter flat option logits `(NO,)` into `(NQ, max_options)`, ``-inf`` where a question has no such option
    (options of a question are consecutive, in order)."""
    counts = torch.bincount(option_question, minlength=n_questions)  # (NQ,)
    starts = torch.cumsum(counts, 0) - counts  # (NQ,)
    rank = torch.arange(option_question.shape[0], device=option_question.device) - starts[option_question]  # (NO,)
    width = int(counts.max()) if counts.numel() and option_question.numel() else 1
    grouped = option_logits.new_full((n_questions, width), float("-inf"))
    return grouped.index_put((option_question, rank), option_logits)  # (NQ, O)


class AleaModel(AleaPreTrainedModel):
    """A decoder backbone with choice, score, noul and regress heads, answering every question of a packed decision
    in one forward pass.

    Build one around a pretrained (or config-built) backbone with [`AleaModel.from_backbone`], reload a saved one with
    ``from_pretrained``, and answer decisions with [`AleaModel.predict`].
    """

    def __init__(self, config: AleaConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        if backbone is not None:
            for module in backbone.modules():  # initialised or loaded by whoever built it: post_init leaves it alone
                module._is_hf_initialized = True
        self.backbone = backbone if backbone is not None else AutoModel.from_config(config.text_config)
        hidden = config.hidden_size
        self.choice_head = nn.Linear(hidden, 1)
        self.score_head = nn.Linear(hidden, config.max_score_bins)
        self.noul_head = nn.Linear(hidden, 1)
        self.regress_head = QuantileHead(hidden, len(config.taus))
        self.aux_embed = nn.Embedding(3, hidden) if config.use_aux_embed else None
        self.bigram = nn.Embedding(config.ngram_buckets, hidden) if config.use_bigram else None
        self.trigram = nn.Embedding(config.ngram_buckets, hidden) if config.use_trigram else None
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs) -> AleaModel:
        """``PreTrainedModel.from_pretrained``, and:

        - a LoRA output of the trainer (a peft adapter folder with the Alea ``config.json``) loads onto the base its
          ``adapter_config.json`` names, as a ``peft.PeftModel`` (``.merge_and_unload()`` gives a plain
          ``AleaModel`` to save as a full checkpoint);
        - a name meant as a local path that does not exist raises `ValueError` at once, naming it;
        - checkpoints whose extras were saved under their former names (``ngram`` / ``ngram2``) load into
          ``bigram`` / ``trigram``.
        """
        path = check_model_path(
            pretrained_model_name_or_path, "AleaModel.from_pretrained", "pretrained_model_name_or_path"
        )
        if is_adapter_folder(path, **kwargs):
            return load_adapter_model(path, **kwargs)
        kwargs.setdefault("key_mapping", _LEGACY_KEYS)
        return super().from_pretrained(path, *args, **kwargs)

    @classmethod
    def from_backbone(cls, name_or_path_or_config, backbone_kwargs: dict | None = None, **head_kwargs) -> AleaModel:
        """Build a fresh AleaModel (new heads) around a backbone.

        Args:
            name_or_path_or_config (`str`, `os.PathLike` or `PreTrainedConfig`):
                A Hub id or local directory of a pretrained decoder (its weights are loaded and the config records it as
                ``backbone_name_or_path``), a ``.gguf`` file (converted once into an ordinary checkpoint in the cache,
                which is what gets recorded: ``alea_trl.model_files.gguf_checkpoint``), or a config (the backbone is
                randomly initialised).
            backbone_kwargs (`dict`, *optional*):
                Passed to ``AutoModel.from_pretrained`` / ``from_config`` (e.g. ``dtype``, ``attn_implementation``).
            **head_kwargs: [`AleaConfig`] fields (``max_score_bins``, ``use_aux_embed``, ...).
        """
        backbone_kwargs = dict(backbone_kwargs or {})
        if isinstance(name_or_path_or_config, PreTrainedConfig):
            backbone = AutoModel.from_config(name_or_path_or_config, **backbone_kwargs)
        else:
            name_or_path_or_config = resolve_gguf(name_or_path_or_config)  # a .gguf file: its cached checkpoint
            backbone = AutoModel.from_pretrained(name_or_path_or_config, **backbone_kwargs)
            head_kwargs.setdefault("backbone_name_or_path", os.fspath(name_or_path_or_config))
        # the composite config propagates its attention implementation to the backbone's: keep the backbone's
        attn = backbone.config._attn_implementation
        config = AleaConfig(text_config=backbone.config, attn_implementation=attn, **head_kwargs)
        if is_deepspeed_zero3_enabled():  # the backbone came partitioned: build the heads partitioned too
            return cls._with_partitioned_heads(config, backbone)
        model = cls(config, backbone=backbone)
        return model.to(backbone.dtype)

    @classmethod
    def _with_partitioned_heads(cls, config: AleaConfig, backbone: PreTrainedModel) -> AleaModel:
        """Under ZeRO-3: the heads and extras built inside ``zero.Init`` (partitioned over the ranks as they are
        created), then initialised module by module while gathered, on rank 0, and broadcast when the gather ends."""
        import deepspeed
        from transformers.integrations import deepspeed_config

        # the dtype comes from the DeepSpeed config, as for the backbone (zero.Init's own dtype argument is ignored
        # on CPU in deepspeed 0.19: it then always builds bfloat16)
        with init.no_init_weights(), deepspeed.zero.Init(config_dict_or_path=deepspeed_config()):
            model = cls(config, backbone=backbone)
        in_backbone = {id(m) for m in backbone.modules()}
        own = [m for m in model.modules() if m is not model and id(m) not in in_backbone]
        with torch.no_grad(), init.guard_torch_init_functions():
            for module in own:
                params = list(module.parameters(recurse=False))
                if not params:
                    continue
                with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                    if deepspeed.comm.get_rank() == 0:
                        model._init_weights(module)
        return model

    # --------------------------------------------------------------------------------------------------- forward
    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.backbone.set_input_embeddings(value)

    def _embed(self, input_ids, role_ids, prev_ids, prev2_ids) -> torch.Tensor:
        embeds = self.backbone.get_input_embeddings()(input_ids)  # (B, L, H)
        if self.aux_embed is not None and role_ids is not None:
            embeds = embeds + self.aux_embed(role_ids)
        if self.bigram is not None and prev_ids is not None:
            bucket, valid = _hash_ngram([prev_ids, input_ids], self.config.ngram_buckets)
            embeds = embeds + self.bigram(bucket) * valid[..., None]
        if self.trigram is not None and prev_ids is not None and prev2_ids is not None:
            bucket, valid = _hash_ngram([prev2_ids, prev_ids, input_ids], self.config.ngram_buckets)
            embeds = embeds + self.trigram(bucket) * valid[..., None]
        return embeds

    def attention_mask_for(
        self, question_seg: torch.Tensor, option_seg: torch.Tensor, doc_seg: torch.Tensor | None = None
    ):
        """The attention mask this model's attention implementation needs: a FlexAttention ``BlockMask`` under
        ``flex_attention``, else the additive float mask in the compute dtype."""
        if self.backbone.config._attn_implementation == "flex_attention":
            return block_mask_from_segments(question_seg, option_seg, doc_seg)
        return mask_from_segments(question_seg, option_seg, self.dtype, doc_seg)

    def forward(
        self,
        input_ids: torch.LongTensor,
        position_ids: torch.LongTensor,
        question_seg: torch.LongTensor,
        option_seg: torch.LongTensor,
        question_index: torch.LongTensor,
        question_bins: torch.LongTensor,
        option_index: torch.LongTensor,
        option_question: torch.LongTensor,
        doc_seg: torch.LongTensor | None = None,
        role_ids: torch.LongTensor | None = None,
        prev_ids: torch.LongTensor | None = None,
        prev2_ids: torch.LongTensor | None = None,
        attention_mask=None,
        **kwargs,
    ) -> AleaOutput:
        """Answer every question of a packed batch (the tensors of a [`PackedBatch`], see ``model_inputs()``).

        ``attention_mask`` is built from the segments when not given. Extra keys of a ``PackedBatch`` that the heads
        do not need (``question_type``, ``question_options``, ``question_row``) are accepted and ignored.
        """
        if attention_mask is None:
            attention_mask = self.attention_mask_for(question_seg, option_seg, doc_seg)
        embeds = self._embed(input_ids, role_ids, prev_ids, prev2_ids)
        hidden = self.backbone(
            inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, L, H)
        q_hidden = hidden[question_index[:, 0], question_index[:, 1]]  # (NQ, H)
        o_hidden = hidden[option_index[:, 0], option_index[:, 1]]  # (NO, H)
        n_q = q_hidden.shape[0]

        option_logits = self.choice_head(o_hidden).squeeze(-1).float()  # (NO,)
        choice_logits = group_option_logits(option_logits, option_question, n_q)  # (NQ, O)

        score_logits = self.score_head(q_hidden).float()  # (NQ, S)
        bins = torch.arange(score_logits.shape[-1], device=score_logits.device)
        limit = torch.where(question_bins > 0, question_bins, score_logits.shape[-1])  # (NQ,)
        score_logits = score_logits.masked_fill(bins[None, :] >= limit[:, None], float("-inf"))

        noul_logits = self.noul_head(q_hidden).squeeze(-1).float()  # (NQ,)
        quantiles = self.regress_head(q_hidden)  # (NQ, T)
        return AleaOutput(
            option_logits=option_logits,
            choice_logits=choice_logits,
            score_logits=score_logits,
            noul_logits=noul_logits,
            quantiles=quantiles,
        )

    # --------------------------------------------------------------------------------------------------- inference
    @staticmethod
    def answers_from_output(output: AleaOutput, questions: Sequence[Sequence]) -> list[dict]:
        """Turn a forward's flat outputs into one ``{qid: answer}`` dict per decision (see :meth:`predict`)."""
        results, flat = [], 0
        for qs in questions:
            answers = {}
            for q in qs:
                if q.qtype == "choice":
                    answers[q.qid] = torch.softmax(output.choice_logits[flat, : len(q.options)], -1)
                elif q.qtype == "score":
                    answers[q.qid] = torch.softmax(output.score_logits[flat, : q.n_bins], -1)
                elif q.qtype == "noul":
                    answers[q.qid] = float(torch.sigmoid(output.noul_logits[flat]))
                else:
                    answers[q.qid] = output.quantiles[flat]
                flat += 1
            results.append(answers)
        return results

    def decision_len_limit(self, max_len: int | None = None) -> int | None:
        """The most tokens a packed decision may have: ``max_len``, by default the backbone's
        ``max_position_embeddings``; a ``max_len`` past the backbone's positions raises `ValueError`."""
        limit = getattr(self.config.get_text_config(), "max_position_embeddings", None)
        if max_len is not None and limit is not None and max_len > limit:
            raise ValueError(
                f"AleaModel: field 'max_len': {max_len} tokens is more than the backbone's max_position_embeddings "
                f"({limit}); a decision that long would run past the positions the backbone knows"
            )
        return limit if max_len is None else max_len

    @torch.no_grad()
    def predict(
        self,
        decisions: Sequence[Decision],
        tokenizer,
        max_len: int | None = None,
        batch_size: int = 16,
    ) -> list[dict]:
        """Answer every question of each decision.

        Args:
            decisions (`Sequence[Decision]`): the decision points.
            tokenizer: the tokenizer of the backbone.
            max_len (`int`, *optional*): raise `ValueError` for decisions that pack to more tokens; defaults to the
                backbone's ``max_position_embeddings``, and may not exceed it.
            batch_size (`int`, defaults to 16): decisions per forward.

        Returns:
            `list[dict]`: for each decision, ``{qid: answer}`` with choice / score answers as probability tensors over
            the options / bins, noul answers as the float p_yes, regress answers as a tensor of quantiles at
            ``config.taus``.
        """
        max_len = self.decision_len_limit(max_len)
        was_training = self.training
        self.eval()
        pad_id = pad_token_id(tokenizer)
        results = []
        for start in range(0, len(decisions), batch_size):
            chunk = decisions[start : start + batch_size]
            packed = [pack_request(tokenizer, d.state, d.questions, max_len=max_len, env=d.env) for d in chunk]
            batch = collate_segments(packed, pad_id).to(self.device)
            output = self(**batch.model_inputs())
            results += self.answers_from_output(output, batch.questions)
        self.train(was_training)
        return results


def load_adapter_model(path: str, **kwargs):
    """A LoRA output (see :mod:`alea_trl.loading`) as a `peft.PeftModel` around its base `AleaModel`."""
    from peft import PeftConfig, PeftModel

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


__all__ = ["AleaModel", "AleaOutput", "AleaPreTrainedModel"]
