"""R-KV: redundancy-aware KV cache compression for reasoning models.

Cai et al., "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models", 2025.
https://arxiv.org/abs/2505.24133
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from foresight.policies._common import QueryWindow, as_float, check_positive_int, pool1d
from foresight.policies.base import EvictionPolicy, check_range
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class RKVPolicy(EvictionPolicy):
    """R-KV: ``score = lam · importance − (1 − lam) · redundancy``.

    * importance: the attention of the last ``window`` queries, averaged over the window, max over the query
      heads of the GQA group, then max-pooled along the tokens (kernel ``kernel``);
    * redundancy: per KV head, the cosine similarity between the candidates' keys (diagonal zeroed, padding
      ignored), averaged over each row, then softmax over the candidates. Tokens whose keys resemble many
      others (repetitive reasoning) are evicted first.

    Differences from the published code: R-KV additionally keeps the most recent copy of near-duplicate keys
    (similarity above a threshold) out of the redundancy term; we implement the rule as stated in the method
    (plain row-mean similarity), so two identical keys have the same redundancy.

    Parameters
    ----------
    lam
        Mixing weight λ in [0, 1] (paper: 0.1).
    window
        Number of most recent queries observed, >= 1 (paper: 8).
    kernel
        Max-pooling kernel size, >= 1 (paper: 7; 1 disables pooling).
    """

    name = "rkv"
    per_layer = True
    selects_rows = True
    observes = True
    observes_layers = True
    lam: float = 0.1
    window: int = 8
    kernel: int = 7

    def __post_init__(self):
        self.lam = as_float("lam", self.lam)
        check_range("lam (lambda)", self.lam, 0.0, 1.0)
        check_positive_int("window", self.window)
        check_positive_int("kernel (pooling kernel size)", self.kernel)

    def reset(self, batch_size, num_layers, device, **meta):
        self.rows = QueryWindow(self.window)
        self.rows.reset(num_layers)

    def select_rows(self, rows):
        self.rows.select_rows(rows)

    def observe(self, view):
        self.rows.push(view.layer_idx, view.probs)  # (b, Hkv, G, q, n)

    def importance(self, view) -> torch.Tensor:
        rows = self.rows.get(view.layer_idx)[..., : view.num_candidates]  # (b, Hkv, G, w, nc)
        return pool1d(rows.mean(dim=-2).amax(dim=2), self.kernel, "max")

    @staticmethod
    def redundancy(keys: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Softmax over tokens of the row-mean cosine similarity of (b, H, n, d) keys; (b, H, n)."""
        k = F.normalize(keys.float(), dim=-1)
        sim = k @ k.transpose(-1, -2)
        sim.diagonal(dim1=-2, dim2=-1).zero_()
        v = valid.to(sim.dtype)
        mean = (sim * v[..., None, :]).sum(-1) / (v.sum(-1, keepdim=True) - 1).clamp(min=1)
        return torch.softmax(mean.masked_fill(~valid, float("-inf")), dim=-1).nan_to_num_(0.0)

    def score(self, view):
        nc = view.num_candidates
        red = self.redundancy(view.keys[..., :nc, :], view.valid[..., :nc])
        return self.lam * self.importance(view) - (1 - self.lam) * red

    def on_evict(self, layer_idx, keep):
        self.rows.gather(layer_idx, keep)
