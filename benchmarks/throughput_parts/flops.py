"""Token and FLOP arithmetic of the throughput variants: what each one's forwards and backwards process per decision.

Design decisions:
1. Every variant records its work as it runs (``Work``): tokens through the backbone with and without autograd, the
   attended keys summed over those tokens (a packed token at position ``p`` attends ``p + 1`` keys, as in a causal
   sequence: questions restart their positions after the state, so this holds for packed decisions too), and the
   positions scored by an LM head. Only real tokens count; padding is recorded apart (``Probe``).
2. FLOPs are model FLOPs of the matrix products (``FlopModel``): per token and decoder layer ``2 x`` its linear
   weights plus ``4 x heads x head_dim`` per attended key; a backward costs ``2 x`` the forward of the layers that
   train (input and weight gradients); an LM-head position ``2 x hidden x vocab`` forward and as much again backward
   (input gradient; twice that when the tied embedding trains). Norms, activations, softmax and Alea's heads
   (``hidden`` FLOPs per read-out) are left out: under 1% here.
"""

from __future__ import annotations

from collections import defaultdict


class Work:
    """Sums of one variant's work over a measured block."""

    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)

    def forward(self, lengths: list[int], grad: bool, ctx: list[int] | None = None, layers: str = "all") -> None:
        """Sequences of ``lengths`` real tokens through ``layers`` (``"all"`` or ``"trained"``); ``ctx`` the keys
        each attends in total (default: a causal sequence from position 0, ``L (L + 1) / 2``)."""
        mode = "grad" if grad else "nograd"
        self.sums[f"tokens_{mode}_{layers}"] += float(sum(lengths))
        self.sums[f"ctx_{mode}_{layers}"] += float(
            sum(ctx) if ctx is not None else sum(n * (n + 1) // 2 for n in lengths)
        )

    def lm_head(self, positions: int, grad: bool) -> None:
        """Positions scored by the LM head (a full-vocabulary projection each)."""
        self.sums["lm_head_grad" if grad else "lm_head_nograd"] += float(positions)

    def add(self, key: str, value: float) -> None:
        self.sums[key] += float(value)

    def tokens(self) -> float:
        """Real tokens through the backbone, with and without autograd."""
        return sum(v for k, v in self.sums.items() if k.startswith("tokens_"))


class FlopModel:
    """Model FLOPs of a decoder of ``config`` whose ``trained_layers`` top layers train.

    Args:
        config: a transformers decoder config (``hidden_size``, ``num_hidden_layers``, ``intermediate_size``,
            ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``vocab_size``).
        trained_layers (`int`): decoder layers whose weights train (the backward runs through them).
        embedding_trains (`bool`): the (tied) embedding / LM head trains.
    """

    def __init__(self, config, trained_layers: int, embedding_trains: bool):
        d, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or d // heads
        self.layers, self.trained_layers = config.num_hidden_layers, trained_layers
        linear = d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d + 3 * d * config.intermediate_size
        self.per_token = 2 * linear  # one layer's forward
        self.per_key = 4 * heads * head_dim  # QK^T and AV, per attended key and layer
        self.per_position = 2 * d * config.vocab_size
        self.head_backward = 2 if embedding_trains else 1

    def _forward(self, tokens: float, ctx: float, layers: int) -> float:
        return layers * (self.per_token * tokens + self.per_key * ctx)

    def flops(self, sums: dict[str, float]) -> dict[str, float]:
        """Forward, backward and LM-head FLOPs of recorded work (``Work.sums``)."""
        n_layers = {"all": self.layers, "trained": self.trained_layers}
        forward = backward = 0.0
        for mode in ("grad", "nograd"):
            for which, layers in n_layers.items():
                tokens, ctx = sums.get(f"tokens_{mode}_{which}", 0.0), sums.get(f"ctx_{mode}_{which}", 0.0)
                forward += self._forward(tokens, ctx, layers)
                if mode == "grad":
                    backward += 2 * self._forward(tokens, ctx, min(layers, self.trained_layers))
        head_grad, head_nograd = sums.get("lm_head_grad", 0.0), sums.get("lm_head_nograd", 0.0)
        lm_head = self.per_position * (head_grad * (1 + self.head_backward) + head_nograd)
        return {"forward": forward, "backward": backward, "lm_head": lm_head, "total": forward + backward + lm_head}


def trained_layer_count(trainable_names: set[str]) -> tuple[int, bool]:
    """Decoder layers with a trainable weight, and whether the embedding trains, from a backbone's trainable
    parameter names (``layers.<i>.…``, ``embed_tokens.weight``)."""
    layers = {name.split(".")[1] for name in trainable_names if name.startswith("layers.")}
    return len(layers), any("embed_tokens" in name for name in trainable_names)
