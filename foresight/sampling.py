"""The one eviction sampler: Plackett–Luce draws without replacement (the ``learned`` policy's
``selection=sample`` *and* GRPO's rollout policy; docs/training.md, "Selection at inference and in GRPO
must be the same distribution").

An eviction at an event draws ``k = W`` candidates *without replacement*; drawing item ``j`` among those left
has probability ``exp(s_j) / sum_{i left} exp(s_i)`` with logits ``s = -score / temperature`` (scores are
*keep* scores, higher = keep). The probability of the ordered draw ``sigma`` is the Plackett–Luce likelihood
(Plackett 1975; Luce 1959)::

    log p(sigma) = sum_t [ s_{sigma_t} - logsumexp(s_i : i not in sigma_1..sigma_{t-1}) ]

and adding i.i.d. Gumbel(0, 1) noise to ``s`` and taking the top-k in order samples exactly this ordered draw
(the Gumbel-top-k trick; Kool, van Hoof & Welling 2019, https://arxiv.org/abs/1903.06059).

We score the *ordered* draw, not the unordered set: the set probability is the sum over its ``k!`` orderings,
intractable for ``k = 32``. Because the environment (the cache) only depends on the set, the ordered draw is
an equally valid stochastic policy: ``E[R grad log p(sigma)]`` is the same policy gradient, and the ordered
importance ratio is an unbiased estimate of the set ratio (``E_{sigma ~ p_old(.|set)}[p_new(sigma)/p_old(sigma)]
= p_new(set)/p_old(set)``). Everything is exact: the draw is over *all* drawable candidates (no top-2W pool),
no first-step approximation.

:func:`sample_eviction` is the draw both call sites make: drawable = candidates with a finite score (the cache
scores protected sinks / prompt ``+inf`` and padding ``-inf``); padding is evicted before the draw, protected
entries only when fewer than ``k`` candidates are drawable (as deterministic top-k would). With no padding and
enough drawable candidates it is exactly ``gumbel_topk(logits, k, drawable)``, whose log-probability is
:func:`log_prob`.

Shapes: ``logits`` (..., C) with an optional boolean ``mask`` (..., C) of drawable items (False items are never
drawn and leave every denominator); ``order`` (..., k) holds indices into the last dim.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import torch

NEG_INF = float("-inf")


def layer_generators(seed: int, num_layers: int, stream: str = "") -> list[torch.Generator]:
    """One CPU generator per layer, each seeded by ``(seed, stream, layer)`` alone (SHA-256), so a layer's draws
    do not depend on the order in which layers draw: piecewise replay draws event by event across layers,
    layer-major replay (:mod:`foresight.layer_major`) layer by layer, and both make the same draws."""
    def seeded(layer: int) -> torch.Generator:
        key = hashlib.sha256(f"{seed}\x00{stream}\x00layer {layer}".encode()).hexdigest()
        return torch.Generator().manual_seed(int(key[:15], 16))
    return [seeded(layer) for layer in range(num_layers)]


def _gumbel_keys(s: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``s`` + i.i.d. Gumbel(0, 1) noise drawn in fp64 on the CPU from ``generator`` (a seed reproduces the same
    draws on any device), cast to ``s.dtype``."""
    u = torch.rand(s.shape, generator=generator, device="cpu", dtype=torch.float64).to(s.device)
    return s + (-torch.log(-torch.log(u.clamp(1e-300, 1.0 - 1e-16)))).to(s.dtype)


def gumbel_topk(logits: torch.Tensor, k: int, mask: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample an ordered draw of ``k`` items without replacement, (..., k) int64 indices, first drawn first.

    The noise comes from ``generator`` on the CPU (so a seed reproduces the same draws on any device).
    Raises ``ValueError`` when a row has fewer than ``k`` drawable items.
    """
    if k < 0 or k > logits.shape[-1]:
        raise ValueError(f"cannot draw k={k} of {logits.shape[-1]} items")
    if k == 0:
        return torch.zeros((*logits.shape[:-1], 0), dtype=torch.long, device=logits.device)
    s = logits.detach().float()
    if mask is not None:
        if int(mask.sum(-1).min()) < k:
            raise ValueError(f"a row has fewer than k={k} drawable items")
        s = s.masked_fill(~mask, NEG_INF)
    return _gumbel_keys(s, generator).topk(k, dim=-1, sorted=True).indices


class EvictionDraw(NamedTuple):
    """One sampled eviction: ``order`` (..., k) candidate indices, first drawn first; the Plackett–Luce
    ``logits`` (..., C) and ``drawable`` mask (..., C) it was drawn with (the arguments of :func:`log_prob`)."""

    order: torch.Tensor
    logits: torch.Tensor
    drawable: torch.Tensor


def eviction_logits(scores: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plackett–Luce logits ``-score / temperature`` (0 where not drawable) and the drawable mask (finite
    scores) of keep ``scores`` (..., C). Differentiable in ``scores``."""
    drawable = torch.isfinite(scores)
    return (-scores / temperature).masked_fill(~drawable, 0.0), drawable


def sample_eviction(scores: torch.Tensor, num_evict: int, temperature: float,
                    generator: torch.Generator | None = None) -> EvictionDraw:
    """Draw ``num_evict`` candidates to evict from keep ``scores`` (..., C) by Plackett–Luce with logits
    ``-score / temperature`` over every drawable (finite-score) candidate; see the module docstring for
    ``-inf`` (padding: evicted first) and ``+inf`` (protected: evicted last, only when nothing else is left).
    """
    if not 0 <= num_evict <= scores.shape[-1]:
        raise ValueError(f"cannot evict {num_evict} of {scores.shape[-1]} candidates")
    logits, drawable = eviction_logits(scores.detach().float(), temperature)
    keys = _gumbel_keys(logits.masked_fill(~drawable, NEG_INF), generator)
    keys = keys.masked_fill(scores == NEG_INF, float("inf"))  # padding first
    return EvictionDraw(keys.topk(num_evict, dim=-1, sorted=True).indices, logits, drawable)


def top_keep(scores: torch.Tensor, num_keep: int) -> torch.Tensor:
    """Indices (..., num_keep) of the ``num_keep`` highest keep scores, the same on every device: among equal
    scores the older entry (lower index) is kept, a stable order. ``torch.topk`` breaks ties differently on CPU and
    CUDA (and by size), which made a policy with tied scores (``lazy``: integer recurrence state, every prompt token
    entering at the same step) evict other entries on a GPU; evicting the older of tied entries first instead drops
    the attention sink and the problem statement among tied prompt tokens (``lazy`` at B=64 on the quality
    benchmark: loss ratio 2.17 that way, 1.78 with the CPU's topk order, 1.39 keeping the older)."""
    return scores.argsort(dim=-1, descending=True, stable=True)[..., :num_keep]


def spread_keep(scores: torch.Tensor, num_keep: int, spread: float) -> torch.Tensor:
    """Indices (..., num_keep) kept, ascending, by evicting one candidate at a time (the lowest score; among equal
    scores the newer, as :func:`top_keep`) and adding ``spread`` to the scores of its two neighbours in the cache,
    so that near-tied neighbours are not evicted together (the redundancy argument of R-KV,
    https://arxiv.org/abs/2505.24133: a span evicted whole loses what one kept member of it would carry). Entries
    with -inf (padding) are evicted first without raising their neighbours, +inf (protected) last; ``spread=0``
    keeps what :func:`top_keep` keeps.

    The greedy loop runs on the scores reversed (so ``argmin``'s first hit among ties is the newest) between two
    sentinel columns (so both neighbours always exist), with padding at the lowest finite float and protected entries
    at the largest (below the evicted mark, +inf). Each evicted entry is four small tensor operations (its
    ``argmin``, its and its neighbours' columns, their additions, and one ``scatter_add_`` of +inf to it and of its
    gain to its neighbours), none reading a value back."""
    c = scores.shape[-1]
    big = torch.finfo(torch.float32).max
    s = scores.float().reshape(-1, c).flip(-1).clamp(-big, big)  # finite, so that adding +inf evicts any entry
    r = torch.nn.functional.pad(s, (1, 1), value=float("inf"))  # (R, c + 2): sentinels at 0 and c + 1
    gain = torch.where(r.abs() < big, spread, 0.0)[:, 1 : c + 1]  # what evicting an entry adds to its neighbours
    # evicting live entry j adds (+inf, gain, gain) to padded columns (j + 1, j, j + 2): itself, then its neighbours
    add = torch.stack((torch.full_like(gain, float("inf")), gain, gain), dim=-1)  # (R, c, 3)
    live = r[:, 1 : c + 1]
    offsets = torch.tensor([[1, 0, 2]], device=r.device)
    for _ in range(c - num_keep):
        j = live.argmin(-1, keepdim=True)  # the lowest live entry (the newest of ties)
        r.scatter_add_(-1, j + offsets, add.gather(1, j[..., None].expand(-1, 1, 3))[:, 0])
    kept = (live != float("inf")).flip(-1).reshape(scores.shape)
    return kept.byte().argsort(dim=-1, descending=True, stable=True)[..., :num_keep]  # the kept, ascending


def kept_indices(order: torch.Tensor, num_candidates: int, num_keep: int) -> torch.Tensor:
    """Indices (..., num_keep) of the candidates an eviction ``order`` (..., k) leaves, ascending."""
    evicted = torch.zeros((*order.shape[:-1], num_candidates), dtype=torch.bool, device=order.device)
    evicted.scatter_(-1, order, True)
    return (~evicted).float().topk(num_keep, dim=-1, sorted=False).indices.sort(-1).values


def log_prob(logits: torch.Tensor, order: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Exact log-probability (...,) of the ordered draw ``order`` under Plackett–Luce with ``logits``.

    Differentiable in ``logits``. Uses the identity: the items left before step ``t`` are the never-drawn
    items plus ``sigma_t..sigma_{k-1}``, so each denominator is ``logaddexp(logsumexp(never drawn),
    reverse-logcumsumexp(drawn logits)[t])``: O(C + k) per row, no (k, C) intermediate, stable.
    """
    s = logits.to(torch.promote_types(logits.dtype, torch.float32))
    k = order.shape[-1]
    if k == 0:
        return s.new_zeros(s.shape[:-1])
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF)
    drawn = s.gather(-1, order)  # (..., k)
    rest_mask = torch.ones_like(s, dtype=torch.bool).scatter_(-1, order, False)
    if mask is not None:
        rest_mask &= mask
    empty = ~rest_mask.any(-1, keepdim=True)
    # Rows where every drawable item was drawn: feed zeros to logsumexp (finite gradients), then drop them.
    rest = s.masked_fill(~rest_mask, NEG_INF).masked_fill(empty, 0.0)
    rest_lse = torch.logsumexp(rest, dim=-1, keepdim=True).masked_fill(empty, NEG_INF)
    tail = torch.logcumsumexp(drawn.flip(-1), dim=-1).flip(-1)  # logsumexp(drawn[t:])
    denom = torch.logaddexp(tail, rest_lse.expand_as(tail))
    return (drawn - denom).sum(-1)


def step_log_probs(logits: torch.Tensor, order: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reference implementation: per-step log-probabilities (..., k) by explicit masking, O(k C) per row.

    Slower than :func:`log_prob` (whose sum it equals); kept for tests and for per-draw diagnostics.
    """
    s = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF)
    out = []
    for t in range(order.shape[-1]):
        idx = order[..., t : t + 1]
        out.append((s.gather(-1, idx) - torch.logsumexp(s, dim=-1, keepdim=True)).squeeze(-1))
        s = s.scatter(-1, idx, NEG_INF)
    return torch.stack(out, dim=-1) if out else s.new_zeros((*s.shape[:-1], 0))


__all__ = ["EvictionDraw", "eviction_logits", "gumbel_topk", "kept_indices", "layer_generators", "log_prob",
           "sample_eviction", "spread_keep", "step_log_probs", "top_keep"]
