"""The backbone all three throughput variants share, and the CPU settings of their runs."""

from __future__ import annotations

import copy

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from alea_trl import AleaModel


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


def backbone_config(vocab_size: int) -> Qwen3Config:
    """The benchmark's backbone: hidden 256 x 4 layers."""
    return qwen3_config(vocab_size, (256, 4, 4, 2, 64, 512), max_position_embeddings=4096, attn_implementation="sdpa")


class Models:
    """One set of seeded random weights; fresh copies for each run."""

    def __init__(self, tokenizer, seed: int):
        self.config = backbone_config(len(tokenizer))
        self.config.pad_token_id = tokenizer.pad_token_id
        self.config.eos_token_id = tokenizer.eos_token_id
        torch.manual_seed(seed)
        lm = Qwen3ForCausalLM(self.config).float()
        self.lm_state = {k: v.clone() for k, v in lm.state_dict().items()}
        torch.manual_seed(seed + 1)
        alea = AleaModel.from_backbone(self.config, backbone_kwargs={"dtype": torch.float32})
        missing, unexpected = alea.backbone.load_state_dict(
            {k[len("model.") :]: v for k, v in self.lm_state.items() if k.startswith("model.")}, strict=True
        )
        assert not missing and not unexpected
        self.alea = alea

    def fresh_alea(self) -> AleaModel:
        return copy.deepcopy(self.alea).train()

    def fresh_lm(self) -> Qwen3ForCausalLM:
        lm = Qwen3ForCausalLM(self.config).float()
        lm.load_state_dict(self.lm_state)
        lm.tie_weights()
        assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
        return lm.train()

    def n_params(self) -> dict:
        lm = self.fresh_lm()
        return {
            "alea": sum(p.numel() for p in self.alea.parameters()),
            "causal_lm": sum(p.numel() for p in lm.parameters()),
        }
