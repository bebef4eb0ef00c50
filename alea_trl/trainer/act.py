"""The act distribution of decisions: the act question's logits read out of a forward, log-probs on the host,
the sampling filters ``top_k`` / ``top_p`` / ``min_p`` over each decision's legal actions, and the width
fitting of per-action rows. The rollout, the forwards and the loss all read the act head through these.

Design decisions (sampling filters):
1. The semantics are transformers' logits warpers (``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper``),
   applied in the order ``generate`` applies them (top-k, then top-p on the renormalised survivors, then min-p), with
   GRPOConfig's "off" values: ``top_k=0``, ``top_p=1.0``, ``min_p=None``. Temperature is the caller's: it comes
   first, as in ``generate``.
2. Rows are decisions with different numbers of legal actions; entries beyond a row's legal actions are ``-inf`` and
   stay so. The most likely legal action always survives, so no row is ever filtered empty.
3. Ties: top-k keeps every action tied with the k-th (as transformers). Top-p keeps every action whose probability
   equals the smallest one kept, where transformers' sort would drop some of the tied actions by their position;
   an action's index (the order of options in the prompt) is arbitrary, so it does not decide. Without ties at the
   boundary the result is transformers'.
4. Pure tensor function, usable on logits or log-probs (the filters depend only on probabilities within a row).
"""

from __future__ import annotations

import math

import torch

from ..questions import ACT_QID


def sampling_filters_active(top_k: int = 0, top_p: float = 1.0, min_p: float | None = None) -> bool:
    """Whether any of the three filters is on (``top_k > 0``, ``top_p < 1`` or ``min_p`` set)."""
    return top_k > 0 or top_p < 1.0 or min_p is not None


def filter_action_logits(
    logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float | None = None
) -> torch.Tensor:
    r"""Restrict each row's sampling distribution with top-k, top-p (nucleus) and min-p filtering.

    Args:
        logits (`torch.Tensor` of shape `(N, A)`):
            Act logits or log-probs (after temperature), ``-inf`` beyond each row's legal actions. Every row needs at
            least one finite entry.
        top_k (`int`, *optional*, defaults to `0`):
            Keep the `top_k` most likely actions of each row (and any tied with the last of them); `0`: off.
        top_p (`float`, *optional*, defaults to `1.0`):
            Keep the smallest set of most likely actions whose probabilities sum to more than `top_p` (and any tied
            with the least likely of them); `1.0`: off. Must be in `(0, 1]`.
        min_p (`float`, *optional*):
            Keep the actions whose probability is at least `min_p` times the row's largest; `None`: off. Must be in
            `[0, 1]`.

    Returns:
        `torch.Tensor` of shape `(N, A)`: ``logits`` with the filtered actions set to ``-inf`` (``logits`` itself when
        every filter is off). A softmax of it is the distribution to sample from.

    Example:

    ```python
    >>> import torch
    >>> from alea_trl.trainer.act import filter_action_logits

    >>> logits = torch.tensor([[2.0, 1.0, 0.0, float("-inf")], [0.0, 0.0, 3.0, 1.0]])
    >>> filter_action_logits(logits, top_k=2)
    tensor([[2., 1., -inf, -inf],
            [-inf, -inf, 3., 1.]])
    ```
    """
    _check_filters(top_k, top_p, min_p)
    if logits.dim() != 2:
        raise ValueError(f"filter_action_logits: field 'logits': must be (N, A), got shape {tuple(logits.shape)}")
    if not sampling_filters_active(top_k, top_p, min_p):
        return logits
    if logits.shape[0] and not torch.isfinite(logits).any(-1).all():
        raise ValueError("filter_action_logits: field 'logits': a row has no legal (finite) action")
    out = logits
    if top_k > 0 and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        probs = out.float().softmax(-1)
        ascending = probs.sort(-1).values
        dropped = ascending.cumsum(-1) <= 1.0 - top_p  # transformers: remove while the mass below stays <= 1 - p
        dropped[..., -1] = False  # the most likely action always stays
        smallest_kept = ascending.masked_fill(dropped, math.inf).amin(-1, keepdim=True)
        out = out.masked_fill(probs < smallest_kept, float("-inf"))
    if min_p is not None:
        probs = out.float().softmax(-1)
        out = out.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return out


def sampling_probs(logp: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float | None = None) -> torch.Tensor:
    """The distribution actions are drawn from, `(N, A)`: ``exp(logp)`` when every filter is off, else the softmax of
    :func:`filter_action_logits` of ``logp`` (log-probs after temperature, ``-inf`` beyond each row's legal actions).
    The policy whose log-probs the loss uses stays the unfiltered one (as TRL's)."""
    if not sampling_filters_active(top_k, top_p, min_p):
        return logp.exp()
    return torch.softmax(filter_action_logits(logp, top_k, top_p, min_p), -1)


def host_log_probs(logits, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Host log-probs `(N, A)` at ``temperature`` of act logits given as `(N, A)` (``-inf`` beyond the legal options)
    or as a list of `(n_legal,)` tensors, and the legal mask."""
    if not isinstance(logits, torch.Tensor):
        logits = torch.nn.utils.rnn.pad_sequence(
            [x.detach().reshape(-1) for x in logits], batch_first=True, padding_value=float("-inf")
        )
    logits = logits.detach().float().cpu()
    return torch.log_softmax(logits / temperature, -1), torch.isfinite(logits)


def no_logits(logits) -> bool:
    """Whether ``logits`` (a tensor, a list of tensors or ``None``s, or ``None``) holds none (no reference policy)."""
    return logits is None or (not isinstance(logits, torch.Tensor) and all(r is None for r in logits))


def _check_filters(top_k, top_p, min_p) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"filter_action_logits: field 'top_k': must be an integer >= 0 (0: off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"filter_action_logits: field 'top_p': must be in (0, 1] (1.0: off), got {top_p!r}")
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise ValueError(f"filter_action_logits: field 'min_p': must be None (off) or in [0, 1], got {min_p!r}")


def act_logits_of(choice_logits: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The act question's option logits of every decision (from a forward's ``choice_logits`` and its batch), `(N, A)`
    padded with ``-inf``, and the legal mask."""
    is_act = torch.tensor([q.qid == ACT_QID for qs in batch.questions for q in qs], device=choice_logits.device)
    logits = choice_logits[is_act]  # (N, A_max over all choice questions)
    legal = torch.isfinite(logits)
    width = int(legal.sum(-1).max())
    return logits[:, :width], legal[:, :width]


def act_rows(choice_logits: torch.Tensor, batch) -> torch.Tensor:
    """The act question's logits of every decision, `(N, A)` in float32, ``-inf`` beyond its legal options."""
    return act_logits_of(choice_logits, batch)[0].float()


def fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` `(N, W)` cut or zero-padded to `(N, width)`, in float32 (per-action rows of another batch)."""
    x = x.to(torch.float32)
    return x[:, :width] if x.shape[-1] >= width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))


__all__ = [
    "act_logits_of",
    "act_rows",
    "filter_action_logits",
    "fit_width",
    "host_log_probs",
    "no_logits",
    "sampling_filters_active",
    "sampling_probs",
]
