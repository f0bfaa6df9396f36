"""PagedEviction: evict whole blocks (pages) of the KV cache.

Chitty-Venkata et al., "PagedEviction: Structured Block-wise KV Cache Pruning for Efficient Large Language
Model Inference", 2025. https://arxiv.org/abs/2509.04377
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foresight.policies._common import check_positive_int
from foresight.policies.base import EvictionPolicy
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class PagedEvictionPolicy(EvictionPolicy):
    """PagedEviction: token score ``‖v‖ / ‖k‖``; evict the blocks of ``block_size`` entries with the lowest mean.

    The candidates are cut into consecutive blocks of ``block_size`` cache entries (pages, counted from the
    oldest entry); a block's score is the mean of its tokens' value-norm/key-norm ratios, and whole blocks are
    evicted, lowest first. ``block_size`` must divide the interval ``W`` so that each event frees whole pages
    (and, with ``block_size`` also dividing ``B``, pages stay aligned with the cache). Attention-free.

    Where the count to evict is not a multiple of the block size (prompt compression right after prefill),
    the last, partially evicted block loses its lowest-scoring tokens. Padding entries go first, blocks
    holding a protected entry (a sink) are never evicted.

    Parameters
    ----------
    block_size
        Page size P, >= 1, dividing the interval W.
    """

    name = "paged"
    per_layer = True
    selects_rows = True  # no per-row state
    block_size: int = 16

    def __post_init__(self):
        check_positive_int("block_size", self.block_size)

    def check_cache(self, budget, interval):
        if interval is not None and interval % self.block_size:
            raise ValueError(
                f"paged: block_size ({self.block_size}) must divide the interval W ({interval}) so that each "
                "eviction frees whole blocks"
            )

    def score(self, view):
        nc = view.num_candidates
        k = view.keys[..., :nc, :].float().norm(dim=-1)
        v = view.values[..., :nc, :].float().norm(dim=-1)
        return v / k.clamp(min=1e-6)

    def block_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Per-token key of its block's score (b, H, nc): mean of the block's finite scores, +inf if it holds
        a protected entry, -inf if it holds only padding."""
        b, h, nc = scores.shape
        p = self.block_size
        nb = -(-nc // p)
        x = torch.nn.functional.pad(scores, (0, nb * p - nc), value=float("nan")).view(b, h, nb, p)
        finite = torch.isfinite(x)
        mean = torch.where(finite, x, 0.0).sum(-1) / finite.sum(-1).clamp(min=1)
        mean = torch.where(finite.any(-1), mean, float("-inf"))
        mean = torch.where((x == float("inf")).any(-1), float("inf"), mean)
        return mean.repeat_interleave(p, dim=-1)[..., :nc]

    def select(self, scores, num_keep, view):
        primary = self.block_scores(scores)
        primary = torch.where(torch.isinf(scores), scores, primary)  # padding first, protected last
        order = scores.argsort(dim=-1, stable=True)  # secondary key: the token's own score
        order = order.gather(-1, primary.gather(-1, order).argsort(dim=-1, stable=True))
        return order[..., scores.shape[-1] - num_keep :]
