"""SnapKV: attention from an observation window of recent queries, pooled.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", NeurIPS 2024.
https://arxiv.org/abs/2404.14469
"""

from __future__ import annotations

from dataclasses import dataclass

from foresight.policies._common import GROUP_REDUCTIONS, QueryWindow, check_choice, check_positive_int, pool1d
from foresight.policies._common import reduce_group
from foresight.policies.base import EvictionPolicy
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class SnapKVPolicy(EvictionPolicy):
    """SnapKV: sum of the attention the last ``window`` queries pay to each token, smoothed by 1-D pooling.

    The attention rows of the last ``window`` queries are kept per layer (aligned with the cache through every
    eviction); at each event their sum over the window, reduced over the GQA group, is pooled along the token
    axis (kernel ``kernel``) so that neighbours of important tokens survive too. SnapKV compresses the prompt
    once; as in R-KV and the ForesightKV baselines we run it at every eviction event of decoding.

    Differences from the published code: the group of query heads is reduced (``group_reduce``, default
    ``mean``) before pooling, so one score per KV head is pooled (identical to pooling per query head for
    ``avg`` pooling).

    Parameters
    ----------
    window
        Number of most recent queries observed, >= 1 (the method: 8..32).
    kernel
        Pooling kernel size, >= 1 (1 disables pooling; the paper uses 5-7).
    pooling
        ``avg`` (the published default) or ``max``.
    group_reduce
        ``mean``, ``max`` or ``sum`` over the query heads of a GQA group.
    """

    name = "snapkv"
    per_layer = True
    selects_rows = True
    observes = True
    observes_layers = True
    attention_score = True
    window: int = 32
    kernel: int = 5
    pooling: str = "avg"
    group_reduce: str = "mean"

    def __post_init__(self):
        check_positive_int("window", self.window)
        check_positive_int("kernel (pooling kernel size)", self.kernel)
        check_choice("pooling", self.pooling, ("avg", "max"))
        check_choice("group_reduce", self.group_reduce, GROUP_REDUCTIONS)

    def reset(self, batch_size, num_layers, device, **meta):
        self.rows = QueryWindow(self.window)
        self.rows.reset(num_layers)

    def select_rows(self, rows):
        self.rows.select_rows(rows)

    def observe(self, view):
        self.rows.push(view.layer_idx, reduce_group(view.probs, self.group_reduce))  # (b, Hkv, q, n)

    def score(self, view):
        s = self.rows.get(view.layer_idx)[..., : view.num_candidates].sum(dim=-2)
        return pool1d(s, self.kernel, self.pooling)

    def on_evict(self, layer_idx, keep):
        self.rows.gather(layer_idx, keep)
