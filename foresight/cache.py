"""The budgeted KV cache: per-KV-head gather eviction with logical positions (DESIGN.md section 1).

Storage is a transformers ``Cache`` whose layers hold keys/values of shape (batch, Hkv, n, d) plus, per entry,
its logical position and a validity flag (False for left-padding). Eviction gathers kept indices *per KV head*:
each head may keep different tokens, but every head and every layer keeps the same count, so SDPA keeps working
with dense tensors and no ragged masks.

The cache is also the switchboard between the model and the eviction policy: the ``"foresight"`` attention
hook (:mod:`foresight.attention`) asks it for each layer's mask and hands it each layer's queries, which it
forwards to the policy's :meth:`~foresight.policies.base.EvictionPolicy.observe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicLayer

from foresight.attention import attention_probs


class BudgetedLayer(DynamicLayer):
    """One layer's keys/values with per-entry logical positions and validity, shape (batch, Hkv, n)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.positions: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None

    def append(self, key_states, value_states, positions, valid):
        keys, values = super().update(key_states, value_states)
        hkv = key_states.shape[1]
        pos = positions[:, None, :].expand(-1, hkv, -1)
        val = valid[:, None, :].expand(-1, hkv, -1)
        if self.positions is None:
            self.positions, self.valid = pos.contiguous(), val.contiguous()
        else:
            self.positions = torch.cat([self.positions, pos], dim=-1)
            self.valid = torch.cat([self.valid, val], dim=-1)
        return keys, values

    def gather(self, keep: torch.Tensor) -> None:
        """Keep entries ``keep`` (batch, Hkv, k), per KV head, in the given order."""
        idx = keep[..., None].expand(-1, -1, -1, self.keys.shape[-1])
        self.keys = self.keys.gather(2, idx)
        self.values = self.values.gather(2, idx)
        self.positions = self.positions.gather(2, keep)
        self.valid = self.valid.gather(2, keep)

    def reset(self) -> None:
        super().reset()
        self.positions = self.valid = None


@dataclass
class StepView:
    """What a policy sees of one layer during a forward step (read-only).

    ``query`` holds the post-RoPE queries of the step's new tokens (batch, Hq, q, d); ``keys``/``values`` the
    whole cache of the layer including the new tokens (batch, Hkv, n, d); ``positions``/``valid`` the per-entry
    logical positions and validity (batch, Hkv, n); ``query_positions`` the new tokens' positions (batch, q).
    """

    layer_idx: int
    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    query_positions: torch.Tensor
    mask: torch.Tensor | None
    step: int
    _probs: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_groups(self) -> int:
        return self.query.shape[1] // self.keys.shape[1]

    @property
    def probs(self) -> torch.Tensor:
        """fp32 attention of the new queries over the cache, (batch, Hkv, G, q, n); computed once, shared."""
        if self._probs is None:
            self._probs = attention_probs(self.query, self.keys, self.mask)
        return self._probs


@dataclass
class EvictView:
    """What a policy sees of one layer at an eviction event.

    The candidates are the first ``num_candidates`` entries (everything but the newest ``interval``); the
    policy returns one score per candidate, higher = keep. ``keys``/``values``/``positions``/``valid`` cover the
    whole layer (batch, Hkv, n[, d]) so policies can use the protected window as context.
    """

    layer_idx: int
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    num_candidates: int
    num_keep: int
    event: int
    step: int

    @property
    def candidate_positions(self) -> torch.Tensor:
        return self.positions[..., : self.num_candidates]


class BudgetedCache(Cache):
    """KV cache that evicts down to ``budget`` entries per (layer, KV head) under an eviction policy.

    Parameters
    ----------
    num_layers
        Decoder layers of the model.
    policy
        An :class:`~foresight.policies.base.EvictionPolicy`.
    budget, interval
        B and W of DESIGN.md section 1; ``budget=None`` never evicts.
    sinks
        The first ``sinks`` logical positions are never evicted.
    """

    def __init__(
        self,
        num_layers: int,
        policy,
        budget: int | None,
        interval: int | None,
        sinks: int = 0,
        num_groups: int = 1,
    ):
        super().__init__(layers=[BudgetedLayer() for _ in range(num_layers)])
        self.num_groups = num_groups
        self.policy = policy
        self.budget = budget
        self.interval = interval
        self.sinks = sinks
        self.protect_len: torch.Tensor | None = None  # (batch,) positions below this are never evicted
        self.step = 0
        self.events = 0
        self.evicted_entries = 0
        self.peak_entries = [0] * num_layers
        self._step_pos: torch.Tensor | None = None
        self._step_valid: torch.Tensor | None = None
        self._has_padding = False
        self._shared_mask: tuple[tuple[int, int], torch.Tensor | None] | None = None

    # -- called by the runtime ----------------------------------------------------------------------------------
    def begin_step(self, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """Declare the logical positions (batch, q) and validity of the tokens the next forward appends."""
        self._step_pos = positions
        self._step_valid = valid
        self._shared_mask = None
        if not self._has_padding and not bool(valid.all()):
            self._has_padding = True

    def end_step(self) -> None:
        self.step += 1
        for i, layer in enumerate(self.layers):
            n = layer.get_seq_length()
            if n > self.peak_entries[i]:
                self.peak_entries[i] = n

    @property
    def length(self) -> int:
        return self.layers[0].get_seq_length()

    @property
    def evicts(self) -> bool:
        return self.budget is not None and getattr(self.policy, "evicts", True)

    def evict(self, target: int, protected_newest: int) -> None:
        """Evict every layer down to ``target`` entries, never touching the newest ``protected_newest``."""
        n = self.length
        n_cand = n - protected_newest
        n_keep = target - protected_newest
        if n <= target or n_cand <= 0 or n_keep < 0:
            return
        for layer_idx, layer in enumerate(self.layers):
            view = EvictView(
                layer_idx=layer_idx,
                keys=layer.keys,
                values=layer.values,
                positions=layer.positions,
                valid=layer.valid,
                num_candidates=n_cand,
                num_keep=n_keep,
                event=self.events,
                step=self.step,
            )
            scores = self.policy.score(view).float()
            scores = scores.masked_fill(~layer.valid[..., :n_cand], float("-inf"))
            protected = layer.positions[..., :n_cand] < self.sinks
            if self.protect_len is not None:
                protected = protected | (layer.positions[..., :n_cand] < self.protect_len[:, None, None])
            scores = scores.masked_fill(protected & layer.valid[..., :n_cand], float("inf"))
            keep = self.policy.select(scores, n_keep, view)
            keep = keep.sort(dim=-1).values
            newest = torch.arange(n_cand, n, device=keep.device).expand(*keep.shape[:2], -1)
            keep = torch.cat([keep, newest], dim=-1)
            layer.gather(keep)
            self.policy.on_evict(layer_idx, keep)
        self.events += 1
        self.evicted_entries += (n - target) * self.layers[0].keys.shape[0] * self.layers[0].keys.shape[1]
        self._shared_mask = None
        if self._has_padding:
            self._has_padding = not all(bool(layer.valid.all()) for layer in self.layers)

    # -- called by transformers' attention modules ----------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].append(key_states, value_states, self._step_pos, self._step_valid)

    def attention_mask(self, layer_idx: int, q: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Boolean SDPA mask (True = attend) for the layer's current step, or None when SDPA needs none."""
        layer = self.layers[layer_idx]
        n = layer.get_seq_length()
        if not self._has_padding:
            if q == 1 or q == n:
                return None
            if self._shared_mask is not None and self._shared_mask[0] == (q, n):
                return self._shared_mask[1]
            mask = _chunk_causal(q, n, layer.keys.device)[None, None]
            self._shared_mask = ((q, n), mask)
            return mask
        # Padding present: per-entry validity, causal inside the chunk; a query always sees itself so that
        # fully padded rows stay finite (their outputs are never used).
        causal = _chunk_causal(q, n, layer.keys.device)
        mask = layer.valid[:, :, None, :] & causal
        mask[..., torch.arange(q), torch.arange(n - q, n)] = True
        g = self.num_groups
        return mask.repeat_interleave(g, dim=1) if g > 1 else mask

    def observe(self, layer_idx: int, query, keys, values, mask: torch.Tensor | None) -> None:
        """Hand the layer's new queries to the policy; ``mask`` is the one :meth:`attention_mask` gave SDPA."""
        if not getattr(self.policy, "observes", False):
            return
        layer = self.layers[layer_idx]
        q, n = query.shape[2], keys.shape[2]
        if mask is None and q > 1:
            # SDPA runs this step with is_causal=True and no mask; the policy's probabilities must be causal too.
            mask = _chunk_causal(q, n, keys.device)[None, None]
        view = StepView(
            layer_idx=layer_idx,
            query=query,
            keys=keys,
            values=values,
            positions=layer.positions,
            valid=layer.valid,
            query_positions=self._step_pos,
            mask=mask,
            step=self.step,
        )
        self.policy.observe(view)

    # -- transformers Cache API -----------------------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length()

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length(layer_idx) + query_length, 0

    def stats(self) -> dict:
        """Cache statistics: peak entries per layer, eviction events, evicted entries (summed over heads)."""
        return {
            "peak_entries": list(self.peak_entries),
            "final_entries": self.length,
            "evictions": self.events,
            "evicted_entries": self.evicted_entries,
        }


def _chunk_causal(q: int, n: int, device) -> torch.Tensor:
    """(q, n) mask: the q newest entries are the queries themselves (causal), older entries all visible."""
    j = torch.arange(n, device=device)
    i = torch.arange(q, device=device)
    return j[None, :] <= (n - q + i)[:, None]
