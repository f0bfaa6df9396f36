"""The one per-candidate feature extractor of the learned scorer (docs/training.md).

ForesightKV (learned KV-cache eviction distilled from a Golden Eviction oracle) scores each cache entry from ``concat(key, value, attention features)``. The public reference implementation computed these
features differently in training and at inference; here a single class, :class:`FeatureExtractor`, is used by
both the ``learned`` policy (generation) and the distillation replay (:mod:`training.sl`), so they cannot drift.

The extractor is an *observer*: it sees every forward step of every layer through
:meth:`FeatureExtractor.observe` (the runtime's :class:`~foresight.cache.StepView`) and keeps, per layer,

* the attention rows of the last ``R = max(W, 32)`` queries over the cache entries, per query head of the
  group: a (batch, Hkv, G, R, n) ring buffer, zero-padded for entries that arrived after a query;
* a per-entry *running* sum of the attention paid by every query observed since the last event (all of a
  step's queries, however many: a prompt prefill may hold far more than ``R``);
* two per-entry accumulators into which the running sum is folded at each event: the cumulative sum
  ``cum += running`` and the decayed cumulative sum ``dec = dec * decay + running`` (decay 0.9); then
  ``running = 0``. Together they cover **every** query since the entry arrived, the prompt's included
  (docs/training.md; the reference code seeds them with the prefill attention), not only the last ``W``
  rows at each event.

Everything is kept aligned with the cache through :meth:`FeatureExtractor.on_evict` (the same gather the
cache applies). At an event, :meth:`FeatureExtractor.features` returns (batch, Hkv, C, D) features of the C
candidates, built by the groups of ``feature_set`` (:mod:`foresight.feature_groups`: key, value, attn, age,
recency, prekey, neighbors).

Normalisation: besides the fixed log transform above, features are standardised per (layer, KV head,
feature) by the scorer with statistics fitted on events sampled uniformly across all training traces (see
:mod:`foresight.scorer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from foresight.feature_groups import (
    DEFAULT_FEATURE_SET,
    FEATURE_GROUPS,
    SHORT_WINDOWS,
    LayerState,
    check_feature_set,
    feature_columns,
    feature_dim,
    ring_slots,
    window_weights,
)
from foresight.recurrence import activate
from foresight.views import EvictLayersView, EvictView, LayersView, StepView


@dataclass
class FeatureExtractor:
    """Accumulates attention statistics while observing and builds per-candidate features at events.

    Parameters
    ----------
    window
        ``W``: the recent-query window of the max/min/sum statistics (normally the eviction interval).
    feature_set
        Feature groups (:mod:`foresight.feature_groups`).
    decay
        Decay of the decayed cumulative sum (``prev * decay + current``).
    """

    window: int
    feature_set: tuple[str, ...] = DEFAULT_FEATURE_SET
    decay: float = 0.9
    num_groups: int = field(default=1, init=False)
    _layers: list[LayerState] = field(default_factory=list, init=False, repr=False)
    # (head % R, filled, device) -> the ring's slots and window weights (ring_state)
    _slot_memo: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.window, int) or self.window <= 0:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {self.decay}")
        self.feature_set = check_feature_set(self.feature_set)

    @property
    def needs_attention(self) -> bool:
        return "attn" in self.feature_set or "neighbors" in self.feature_set or self.needs_recency or self.needs_queries

    @property
    def needs_queries(self) -> bool:
        return "query" in self.feature_set

    @property
    def needs_recency(self) -> bool:
        return "recency" in self.feature_set

    @property
    def history(self) -> int:
        """Rows kept in the ring buffer: enough for the ``W`` window and the fixed short windows."""
        return max(self.window, *SHORT_WINDOWS)

    def dim(self, head_dim: int, num_groups: int) -> int:
        return feature_dim(self.feature_set, head_dim, num_groups)

    def reset(self, num_layers: int, num_groups: int = 1) -> None:
        """Forget everything (a new batch of sequences)."""
        self.num_groups = num_groups
        self._layers = [LayerState() for _ in range(num_layers)]
        self._rows: torch.Tensor | None = None  # (L, b, Hkv, G, R, capacity): every layer's ring
        self._run: torch.Tensor | None = None  # (L, b, Hkv, G, capacity): every layer's running sum
        self._seen: torch.Tensor | None = None  # (L, b, Hkv, G, capacity): recency state (needs_recency only)
        self._mri: torch.Tensor | None = None
        self._queries: torch.Tensor | None = None  # (L, b, Hq, R, d): the query ring (needs_queries only)
        self._query_pos: torch.Tensor | None = None  # (L, b, R)
        self._query_ok: torch.Tensor | None = None  # (L, b, R)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows ``rows`` of every layer's statistics (:meth:`foresight.cache.BudgetedCache.select_rows`)."""
        for name in ("rows", "run", "seen", "mri", "queries", "query_pos", "query_ok"):
            stacked = getattr(self, "_" + name)
            if stacked is None:
                continue
            self._attach(name, stacked.index_select(1, rows))
        for st in self._layers:
            st.cum, st.dec = (None if t is None else t.index_select(0, rows) for t in (st.cum, st.dec))

    def _reserve_queries(self, query: torch.Tensor) -> None:
        """The query ring of every layer for queries like ``query`` (b, Hq, q, d), zero (not real) until written."""
        if self._queries is not None and self._queries.shape[1:3] == query.shape[:2] \
                and self._queries.shape[-1] == query.shape[-1]:
            return
        b, hq, _, d = query.shape
        n_layers, r = len(self._layers), self.history
        self._attach("queries", query.new_zeros(n_layers, b, hq, r, d, dtype=torch.float32))
        self._attach("query_pos", torch.zeros(n_layers, b, r, dtype=torch.long, device=query.device))
        self._attach("query_ok", torch.zeros(n_layers, b, r, dtype=torch.bool, device=query.device))

    def _attach(self, name: str, stacked: torch.Tensor) -> None:
        """Make ``stacked`` (L, ...) the storage ``_<name>``; each layer's state ``name`` is its slice."""
        setattr(self, "_" + name, stacked)
        for i, st in enumerate(self._layers):
            setattr(st, name, stacked[i])

    def _newest_slots(self, head: int, q: int, device) -> torch.Tensor:
        """Ring slots of the newest ``min(q, R)`` of ``q`` queries arriving after ``head`` queries, oldest first."""
        return ring_slots(head + q, min(q, self.history), self.history, device)

    @staticmethod
    def _store_queries(ring, pos, real, query, query_positions, probs, slots) -> None:
        """Write the newest ``len(slots)`` query rows into the ring slots ``slots``: ``query`` (..., b, Hq, q, d)
        post-RoPE, ``query_positions`` (b, q), ``probs`` (..., b, Hkv, G, q, n) tells padded rows (they see no
        entry) from real ones; ``ring`` (..., b, Hq, R, d), ``pos`` and ``real`` (..., b, R)."""
        keep = slots.shape[0]
        ring.index_copy_(-2, slots, query[..., -keep:, :].float())
        pos.index_copy_(-1, slots, query_positions[:, -keep:].expand(*pos.shape[:-1], keep))
        real.index_copy_(-1, slots, probs[..., 0, 0, -keep:, :].sum(-1) > 0)

    def _reserve(self, probs: torch.Tensor, n: int) -> None:
        """Room for ``n`` entries in every layer (new columns zero); ``probs`` is one layer's (b, Hkv, G, q, n)."""
        rows = self._rows
        if rows is not None and n <= rows.shape[-1] and rows.shape[1:4] == probs.shape[:3]:
            return
        cap = 0 if rows is None else rows.shape[-1]
        new = max(n, 2 * cap, 64)
        shape = (len(self._layers), *probs.shape[:3])
        grown = {"rows": probs.new_zeros(*shape, self.history, new), "run": probs.new_zeros(*shape, new)}
        if self.needs_recency:
            grown["seen"] = torch.zeros(*shape, new, dtype=torch.long, device=probs.device)
            grown["mri"] = torch.zeros_like(grown["seen"])
        for name, buf in grown.items():
            old = getattr(self, "_" + name)
            if old is not None:
                buf[..., :cap] = old
            self._attach(name, buf)

    def _recur(self, last: torch.Tensor, mri: torch.Tensor, probs: torch.Tensor, mask, positions, have: int,
               query_positions: torch.Tensor) -> None:
        """The recency state's update for query rows ``probs`` (..., b, Hkv, G, q, n): entries ``have:n`` arrive
        (``last`` = their position), then the rows activate the entries they pay more than the uniform share."""
        n = probs.shape[-1]
        last[..., have:n] = positions[..., None, have:n]
        mri[..., have:n] = 0
        if mask is None:
            act = probs * n >= 1
        else:  # a row's share is over the entries it may attend (chunk causality, padding)
            visible = mask.sum(-1, keepdim=True)  # (mb, 1 or Hq, q, 1)
            q = visible.shape[2]
            visible = visible.view(visible.shape[0], 1, 1, q, 1) if visible.shape[1] == 1 else \
                visible.view(visible.shape[0], probs.shape[-4], probs.shape[-3], q, 1)
            act = probs * visible >= 1
        activate(last[..., :n], mri[..., :n], act, query_positions[:, None, None, :, None])

    # -- observation ----------------------------------------------------------------------------------------------
    def observe(self, view: StepView) -> None:
        """Write the step's attention rows (batch, Hkv, G, q, n) into the layer's ring and add all of them to the
        running sum (in place: a decode step allocates nothing)."""
        if not self.needs_attention:
            return
        st = self._layers[view.layer_idx]
        probs = view.probs  # (b, h, g, q, n), fp32, zero where masked
        q, n = probs.shape[3], probs.shape[4]
        history = self.history
        self._reserve(probs, n)
        if self.needs_recency:
            self._recur(st.seen, st.mri, probs, view.mask, view.positions, st.n, view.query_positions)
        st.n = n
        if q == 1:  # a decode step: one row, written to its ring slot by a plain copy (no index tensor)
            row = probs[:, :, :, 0]
            st.run[..., :n].add_(row)  # the sum over a single row is the row itself
            st.rows[:, :, :, st.head % history, :n].copy_(row)
        else:
            st.run[..., :n].add_(probs.sum(3))
            slots = self._newest_slots(st.head, q, probs.device)
            st.rows[..., :n].index_copy_(3, slots, probs[..., q - slots.shape[0] :, :])
        if self.needs_queries:
            self._reserve_queries(view.query)
            slots = self._newest_slots(st.head, q, probs.device)
            self._store_queries(st.queries, st.query_pos, st.query_ok, view.query, view.query_positions, probs, slots)
        st.head += q
        st.filled = min(st.filled + q, history)

    def observe_layers(self, view: LayersView) -> None:
        """:meth:`observe` for every layer at once (``view.probs`` (L, b, Hkv, G, k, n), k held decode steps): the
        same copies and additions on the stacked storage."""
        if not self.needs_attention:
            return
        layers = self._layers
        probs = view.probs
        k, n = probs.shape[-2], probs.shape[-1]
        if len({(st.n, st.head) for st in layers}) != 1:  # layers out of step: one by one
            for i in range(view.num_layers):
                self.observe(view.layer(i))
            return
        history, head = self.history, layers[0].head
        self._reserve(probs[0], n)
        if self.needs_recency:
            self._recur(self._seen, self._mri, probs, view.mask, view.positions, layers[0].n, view.query_positions)
        if k == 1:
            row = probs[:, :, :, :, 0]  # (L, b, Hkv, G, n)
            self._run[..., :n].add_(row)
            self._rows[:, :, :, :, head % history, :n].copy_(row)
        else:
            self._run[..., :n].add_(probs.sum(4))
            slots = self._newest_slots(head, k, probs.device)
            self._rows[..., :n].index_copy_(4, slots, probs[..., k - slots.shape[0] :, :])
        if self.needs_queries:
            self._reserve_queries(view.query[0])
            slots = self._newest_slots(head, k, probs.device)
            self._store_queries(self._queries, self._query_pos, self._query_ok, view.query, view.query_positions,
                                probs, slots)
        for st in layers:
            st.n = n
            st.head += k
            st.filled = min(st.filled + k, history)

    # -- events ---------------------------------------------------------------------------------------------------
    def features(self, view: EvictView) -> torch.Tensor:
        """Features of the candidates of one layer at an event, (batch, Hkv, C, D) fp32.

        Call exactly once per layer and event: it also folds the running sum (every query since the last
        event) into the cumulative and decayed sums and restarts it (over all entries, candidates and
        protected ones).
        """
        return self._features(view, self._layers[view.layer_idx])

    def features_layers(self, view: EvictLayersView) -> torch.Tensor:
        """:meth:`features` of the layers ``view.layers`` at one event, (L, batch, Hkv, C, D): the same groups run
        once over the layers folded into the batch (:meth:`EvictLayersView.folded`), so the columns equal each
        layer's own; layers out of step with each other (a layer-major span) are taken one by one."""
        folded = self.layers_state(view.layers)
        if folded is None:
            return torch.stack([self.features(view.layer(i)) for i in range(view.num_layers)])
        self.fold(folded)
        feats = self.groups(view.folded(), folded)
        self.unfold(view.layers, folded)
        return feats.unflatten(0, (view.num_layers, -1))

    def layers_state(self, layers: range) -> LayerState | None:
        """The state of ``layers`` folded into the batch, ready for an event (:meth:`ring_state`); None unless every
        layer is in the same state of observation. After the event, :meth:`unfold` hands it back to the layers."""
        folded = self._folded(layers)
        return None if folded is None else self.ring_state(folded)

    def _features(self, view: EvictView, st: LayerState) -> torch.Tensor:
        self.fold(self.ring_state(st))
        return self.groups(view, st)

    def layer_state(self, layer_idx: int) -> LayerState:
        """Layer ``layer_idx``'s state, ready for an event: :meth:`ring_state`."""
        return self.ring_state(self._layers[layer_idx])

    def ring_state(self, st: LayerState) -> LayerState:
        """``st`` with the ring slots of every window the groups read (``slots``: tensors, the same for every event at
        the same ring offset and fill, so made once), so that :meth:`groups` reads no query counter and a compiled
        event does not recompile as the counter moves."""
        if st.rows is not None:
            size = st.rows.shape[3]
            key = (st.head % size, st.filled, st.rows.device)
            memo = self._slot_memo.get(key)
            if memo is None:
                counts = {min(k, st.filled) for k in (self.window, *SHORT_WINDOWS)}
                memo = self._slot_memo[key] = ({k: ring_slots(st.head, k, size, st.rows.device) for k in counts},
                                               window_weights(st.head, st.filled, self.window, size, st.rows.device))
            st.slots, st.windows = memo
        return st

    def fold(self, st: LayerState) -> None:
        """Fold the running sum (every query since the last event) into the cumulative and decayed sums, and restart
        it: the first half of :meth:`features`."""
        if self.needs_attention and st.run is not None:
            run = st.run[..., : st.n]
            if st.cum is None:
                st.cum, st.dec = run.clone(), run.clone()
            else:
                pad = (0, st.n - st.cum.shape[-1])
                st.cum = torch.nn.functional.pad(st.cum, pad).add_(run)
                st.dec = torch.nn.functional.pad(st.dec, pad).mul_(self.decay).add_(run)
            run.zero_()

    def groups(self, view: EvictView, st: LayerState) -> torch.Tensor:
        """The (batch, Hkv, C, D) features of ``view``'s candidates from the layer's folded state ``st``
        (:meth:`ring_state`, :meth:`fold`): the groups of ``feature_set``, side by side, the second half of
        :meth:`features`. Tensors and fixed sizes in, tensors out: the unit a compiled event runs."""
        c = view.num_candidates
        return torch.cat([FEATURE_GROUPS[name][1](view, self, st, c) for name in self.feature_set], dim=-1)

    def on_evict(self, layer_idx: int, keep: torch.Tensor) -> None:
        """Keep the per-entry state of entries ``keep`` (batch, Hkv, k), as the cache just did."""
        self._on_evict(self._layers[layer_idx], keep)

    def on_evict_layers(self, layers: range, keep: torch.Tensor) -> None:
        """:meth:`on_evict` of the layers ``layers`` at once, ``keep`` (L, batch, Hkv, k)."""
        folded = self._folded(layers)
        if folded is None:
            for i, layer_idx in enumerate(layers):
                self.on_evict(layer_idx, keep[i])
            return
        self._on_evict(folded, keep.flatten(0, 1))
        self.unfold(layers, folded)

    @staticmethod
    def _on_evict(st: LayerState, keep: torch.Tensor) -> None:
        if st.rows is None:
            return
        b, h, k = keep.shape
        g, r, n = st.rows.shape[2], st.rows.shape[3], st.n
        rows = st.rows[..., :n].gather(-1, keep[:, :, None, None, :].expand(b, h, g, r, k))
        st.rows[..., :k].copy_(rows)
        st.rows[..., k:n].zero_()
        idx = keep[:, :, None, :].expand(b, h, g, k)
        run = st.run[..., :n].gather(-1, idx)
        st.run[..., :k].copy_(run)
        st.run[..., k:n].zero_()
        if st.seen is not None:
            for buf in (st.seen, st.mri):
                buf[..., :k] = buf[..., :n].gather(-1, idx)
        st.n = k
        if st.cum is not None:
            st.cum, st.dec = st.cum.gather(-1, idx), st.dec.gather(-1, idx)

    # -- layers folded into the batch -----------------------------------------------------------------------------
    def _folded(self, layers: range) -> LayerState | None:
        """One :class:`LayerState` of the layers ``layers`` folded into the batch: views of the stacked storage
        (written in place through them) and the layers' ``cum``/``dec`` stacked; None unless every layer is in the
        same state of observation (same entries, queries and events), as at a decode step's event."""
        states = [self._layers[i] for i in layers]
        first = states[0]
        shape = None if first.cum is None else first.cum.shape
        if any((st.n, st.head, st.filled, None if st.cum is None else st.cum.shape) != (first.n, first.head,
               first.filled, shape) for st in states):
            return None

        def fold(t):
            return None if t is None else t[layers.start : layers.stop].flatten(0, 1)

        def stack(name):
            return None if shape is None else torch.stack([getattr(st, name) for st in states]).flatten(0, 1)

        return LayerState(rows=fold(self._rows), run=fold(self._run), n=first.n, head=first.head,
                          filled=first.filled, cum=stack("cum"), dec=stack("dec"), seen=fold(self._seen),
                          queries=fold(self._queries), query_pos=fold(self._query_pos),
                          query_ok=fold(self._query_ok), mri=fold(self._mri))

    def unfold(self, layers: range, folded: LayerState) -> None:
        """Hand what :meth:`fold`/:meth:`_on_evict` replaced in ``folded`` back to each layer's state."""
        num = len(layers)
        cum = None if folded.cum is None else folded.cum.unflatten(0, (num, -1))
        dec = None if folded.dec is None else folded.dec.unflatten(0, (num, -1))
        for i, layer_idx in enumerate(layers):
            st = self._layers[layer_idx]
            st.n = folded.n
            if cum is not None:
                st.cum, st.dec = cum[i], dec[i]

__all__ = [
    "DEFAULT_FEATURE_SET",
    "FEATURE_GROUPS",
    "FeatureExtractor",
    "check_feature_set",
    "feature_columns",
    "feature_dim",
]
