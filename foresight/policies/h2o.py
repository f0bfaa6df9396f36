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
    per_layer = True
    selects_rows = True
    observes = True
    observes_layers = True
    attention_score = True  # nonnegative attention mass: usable inside ``caote``
    group_reduce: str = "sum"

    def __post_init__(self):
        check_choice("group_reduce", self.group_reduce, GROUP_REDUCTIONS)

    def reset(self, batch_size, num_layers, device, **meta):
        self.state = EntryState()
        self.state.reset(num_layers)
        # the accumulated attention of every layer in one capacity buffer (L, b, Hkv, capacity), zero past each
        # layer's entries: a step adds its row in place, for one layer or for all layers at once
        self._acc: torch.Tensor | None = None
        self._n = [0] * num_layers

    def select_rows(self, rows):
        if self._acc is not None:
            self._attach(self._acc.index_select(1, rows))

    def _attach(self, acc: torch.Tensor) -> None:
        """Make ``acc`` (L, b, Hkv, capacity) the buffer; the state's tensors are views of it."""
        self._acc = acc
        for layer, have in enumerate(self._n):
            self.state.set(layer, "acc", acc[layer, ..., :have])

    def _received(self, p):
        """Attention each entry received from a step: (..., Hkv, G, q, n) probabilities -> (..., Hkv, n)."""
        if self.group_reduce == "sum":
            return p.sum(dim=(-3, -2))
        return reduce_group(p, self.group_reduce, dim=-3).sum(dim=-2)

    def _reserve(self, like: torch.Tensor, n: int) -> None:
        """Room for ``n`` entries in every layer (``like``: one layer's (b, Hkv, n) row)."""
        acc = self._acc
        if acc is not None and n <= acc.shape[-1] and acc.shape[1:3] == like.shape[:2]:
            return
        cap = 0 if acc is None else acc.shape[-1]
        grown = like.new_zeros(len(self._n), *like.shape[:2], max(n, 2 * cap, 64))
        if acc is not None:
            grown[..., :cap] = acc
        self._attach(grown)

    def observe(self, view):
        a = self._received(view.probs)  # (b, Hkv, n)
        layer, n = view.layer_idx, a.shape[-1]
        self._reserve(a, n)
        acc = self._acc[layer, ..., :n]
        acc.add_(a)  # new entries start at 0; IEEE addition commutes, so this equals a + acc bit for bit
        self._n[layer] = n
        self.state.set(layer, "acc", acc)

    def observe_layers(self, view):
        if len(set(self._n)) != 1:  # layers out of step (not in a decode step of a whole model): one by one
            return super().observe_layers(view)
        a = self._received(view.probs)  # (L, b, Hkv, n)
        n = a.shape[-1]
        self._reserve(a[0], n)
        self._acc[..., :n].add_(a)
        for layer in range(len(self._n)):
            self._n[layer] = n
            self.state.set(layer, "acc", self._acc[layer, ..., :n])

    def score(self, view):
        return self.state.get(view.layer_idx, "acc")[..., : view.num_candidates].clone()  # the buffer changes later

    def on_evict(self, layer_idx, keep):
        if self._acc is None:
            return
        k, n = keep.shape[-1], self._n[layer_idx]
        acc = self._acc[layer_idx]
        acc[..., :k] = acc[..., :n].gather(-1, keep)
        acc[..., k:n].zero_()
        self._n[layer_idx] = k
        self.state.set(layer_idx, "acc", acc[..., :k])
