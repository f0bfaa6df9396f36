"""H2O: Heavy-Hitter Oracle, cumulative attention received.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models",
NeurIPS 2023. https://arxiv.org/abs/2306.14048
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foresight.policies._common import GROUP_REDUCTIONS, check_choice, reduce_group
from foresight.policies.base import EntryState, EvictionPolicy
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class H2OPolicy(EvictionPolicy):
    """H2O: keep the heavy hitters, the tokens with the largest attention accumulated from every query so far.

    Each cached token's score is the sum of the attention it received from all queries since it entered the
    cache (queries of the prompt and of every generated token, in every head of its GQA group). The score is
    carried through evictions, so it is cumulative over the whole generation. The paper keeps a recent window
    besides the heavy hitters; here that window is the runtime's protected newest ``W`` (plus optional sinks).

    Differences from the published code: H2O evicts one token per step with per-(query-)head scores; we evict
    ``W`` at a time (the runtime's interval) and keep one score per KV head, reducing its GQA group with
    ``group_reduce`` (default ``sum``).

    Parameters
    ----------
    group_reduce
        ``sum``, ``mean`` or ``max`` over the query heads of a GQA group, applied per query before accumulating.
    """

    name = "h2o"
    observes = True
    attention_score = True  # nonnegative attention mass: usable inside ``caote``
    group_reduce: str = "sum"

    def __post_init__(self):
        check_choice("group_reduce", self.group_reduce, GROUP_REDUCTIONS)

    def reset(self, batch_size, num_layers, device, **meta):
        self.state = EntryState()
        self.state.reset(num_layers)
        # per layer: the accumulated attention in a capacity buffer (b, Hkv, capacity), zero past the cache's
        # entries, so a decode step adds its row in place instead of allocating a new accumulator
        self._buf: list[torch.Tensor | None] = [None] * num_layers

    def observe(self, view):
        p = view.probs  # (b, Hkv, G, q, n)
        a = p.sum(dim=(2, 3)) if self.group_reduce == "sum" else reduce_group(p, self.group_reduce).sum(dim=2)
        layer, n = view.layer_idx, a.shape[-1]
        buf = self._buf[layer]
        if buf is None or n > buf.shape[-1]:
            grown = a.new_zeros(*a.shape[:2], max(n, 2 * (0 if buf is None else buf.shape[-1]), 64))
            if buf is not None:
                have = self.state.get(layer, "acc").shape[-1]
                grown[..., :have] = buf[..., :have]
            buf = self._buf[layer] = grown
        acc = buf[..., :n]
        acc.add_(a)  # new entries start at 0; IEEE addition commutes, so this equals a + acc bit for bit
        self.state.set(layer, "acc", acc)

    def score(self, view):
        return self.state.get(view.layer_idx, "acc")[..., : view.num_candidates].clone()  # the buffer changes later

    def on_evict(self, layer_idx, keep):
        buf, acc = self._buf[layer_idx], self.state.get(layer_idx, "acc")
        if buf is None:
            return
        k, n = keep.shape[-1], acc.shape[-1]
        buf[..., :k] = acc.gather(-1, keep)
        buf[..., k:n].zero_()
        self.state.set(layer_idx, "acc", buf[..., :k])
