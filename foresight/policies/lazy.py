"""LazyEviction: lagged eviction with recurrence-interval tracking.

"LazyEviction: Lagged KV Eviction with Attention Pattern Observation for Efficient Long Reasoning",
https://arxiv.org/abs/2506.15969
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from foresight.policies._common import GROUP_REDUCTIONS, as_float, check_choice, reduce_group
from foresight.policies.base import EntryState, EvictionPolicy, check_range
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class LazyEvictionPolicy(EvictionPolicy):
    """LazyEviction: keep tokens that recur (short maximum recurrence interval) or were activated recently.

    Every cached token carries ``last`` (the step it was last *activated*) and ``mri`` (its maximum recurrence
    interval). At every step ``t`` the query's attention ``a_t`` over the cache activates the tokens with
    ``a_t >= alpha``; for them ``mri = max(mri, t - last)`` and then ``last = t``. A new token enters with
    ``last = t``, ``mri = 0``. At an eviction event the score is ``I = s1 + s2`` with
    ``s1 = 2·σ(-(1 + (t - last) / (mri + eps)))`` and ``s2 = 0 if mri == 0 else 2·σ(1 - mri)``; the top scores
    are kept (plus the protected newest ``W``, the paper's lagged observation window).

    Steps are logical positions (a row's ``t`` is the position of its newest query), so batch rows with
    different prompt lengths and chunked replay (several query rows per forward, processed in order) behave
    exactly like token-by-token decoding.

    Differences from the published code: it keeps one cache per *query* head and protects no sink tokens; we
    keep per-KV-head caches like every other policy here and reduce the GQA group's attention before the
    threshold (``group_reduce="max"``: a token is activated when any query head of its group attends to it
    with at least ``alpha``). The paper picks ``W`` so that it covers the MRI of ~80% of tokens; here ``W``
    is the runtime's interval (:meth:`mri_quantile` reports the statistic to choose it).

    Parameters
    ----------
    alpha
        Activation threshold on the attention weight, > 0 (paper: 1e-4 .. 5e-4).
    eps
        Added to ``mri`` in the ``s1`` denominator, > 0.
    group_reduce
        ``max``, ``mean`` or ``sum`` over the query heads of a GQA group.
    """

    name = "lazy"
    observes = True
    alpha: float = 1e-4
    eps: float = 1e-6
    group_reduce: str = "max"

    def __post_init__(self):
        self.alpha, self.eps = as_float("alpha", self.alpha), as_float("eps", self.eps)
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0 (an attention threshold), got {self.alpha!r}")
        check_range("alpha", self.alpha, 0.0, 1.0)
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps!r}")
        check_choice("group_reduce", self.group_reduce, GROUP_REDUCTIONS)

    def reset(self, batch_size, num_layers, device, **meta):
        self.state = EntryState()
        self.state.reset(num_layers)
        self._t: list[torch.Tensor | None] = [None] * num_layers

    def observe(self, view):
        layer = view.layer_idx
        a = reduce_group(view.probs, self.group_reduce)  # (b, Hkv, q, n)
        # integer steps (logical positions): exact, and no casts on the per-step path
        last, mri = self._grow(layer, view.positions, a.shape[-1])
        act = a >= self.alpha
        t = view.query_positions  # (b, q)
        if a.shape[2] == 1:
            act = act[:, :, 0]
            tt = t.view(-1, 1, 1)
            mri = torch.maximum(mri, (tt - last) * act)  # t >= last, so inactive entries keep their mri
            last = torch.where(act, tt, last)
        else:
            # Rows in order: the previous activation of row i is the latest activation among rows < i, or `last`.
            tq = t[:, None, :, None]  # (b, 1, q, 1)
            upto = torch.where(act, tq, -1).cummax(dim=2).values  # latest activation among rows <= i (-1: none)
            prev = torch.cat([last[:, :, None], torch.maximum(upto[:, :, :-1], last[:, :, None])], dim=2)
            mri = torch.maximum(mri, ((tq - prev) * act).amax(dim=2))
            last = torch.maximum(last, upto[:, :, -1])
        self.state.set(layer, "last", last)
        self.state.set(layer, "mri", mri)
        self._t[layer] = t[:, -1]

    def _grow(self, layer: int, positions: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``last``/``mri`` extended to the cache's ``n`` entries (new entries: last = own position, mri = 0)."""
        last, mri = self.state.get(layer, "last"), self.state.get(layer, "mri")
        if last is None:
            return positions[..., :n].clone(), torch.zeros_like(positions[..., :n])
        have = last.shape[-1]
        if have < n:
            last = torch.cat([last, positions[..., have:n]], dim=-1)
            mri = F.pad(mri, (0, n - have))
        return last, mri

    def score(self, view):
        layer, nc = view.layer_idx, view.num_candidates
        last = self.state.get(layer, "last")[..., :nc].float()
        mri = self.state.get(layer, "mri")[..., :nc].float()
        t = self._t[layer][:, None, None].float()
        s1 = 2 * torch.sigmoid(-(1 + (t - last) / (mri + self.eps)))
        s2 = torch.where(mri > 0, 2 * torch.sigmoid(1 - mri), torch.zeros_like(mri))
        return s1 + s2

    def on_evict(self, layer_idx, keep):
        self.state.gather(layer_idx, keep)

    def mri_quantile(self, q: float = 0.8) -> float:
        """The ``q``-quantile of the MRI over all cached tokens that recurred (the paper sizes ``W`` by it)."""
        vals = [d["mri"][d["mri"] > 0].flatten().float() for d in self.state.tensors if "mri" in d]
        vals = torch.cat(vals) if vals else torch.zeros(0)
        return float(vals.quantile(q)) if vals.numel() else 0.0
