"""The budgeted KV cache: per-KV-head gather eviction with logical positions, and the one owner of the eviction rule.

Storage is a transformers ``Cache`` whose layers hold keys/values of shape (batch, Hkv, n, d) plus, per entry,
its logical position and a validity flag (False for left-padding). Eviction gathers kept indices *per KV head*:
each head may keep different tokens, but every head and every layer keeps the same count, so SDPA keeps working
with dense tensors and no ragged masks.

The cache decides *and* performs evictions (docs/runtime.md, :mod:`foresight.schedule`): after every forward
that leaves it holding ``B + W`` entries it scores the ``B`` oldest with its policy and gathers them down to ``B``.
A forward that would cross an event point is fed in pieces cut at those points (chunked prefill), so a prompt of
any length meets the same schedule as replay.

It works inside ``model.generate`` too (kvpress-style drop-in)::

    cache = BudgetedCache(model, policy="h2o", budget=128, interval=32)
    model.generate(input_ids, past_key_values=cache, max_new_tokens=256)

Building a cache for a model installs two forward hooks on it once (:mod:`foresight.forward_hooks`): they declare
each forward's new tokens to the cache, cut an over-long prefill at the event points, route attention through
:mod:`foresight.attention` and close the step, which fires the event when one is due.

The entries live in capacity buffers shared by all layers (:mod:`foresight.kv_storage`). With gradients
(``foresight.replay(..., grad=True)``, used by ``foresight train adapt``) the same cache serves the student's
forward: eviction decisions and the policy's statistics stay under ``no_grad``, and the layers keep their entries
out of place, so gradients flow through every kept key and value.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from foresight.forward_hooks import install_hooks
from foresight.kv_storage import BudgetedLayer, SharedBuffers
from foresight.layer_major import Piece, Span
from foresight.models import base_model_of, check_supported, model_fingerprint, model_shape, rope_of
from foresight.observer import Observer
from foresight.policies import EvictionPolicy, make_policy
from foresight.schedule import CacheConfig, next_event, replay_schedule
from foresight.views import EvictLayersView, EvictView, StepView, attention_probs, chunk_causal, kept_entries

#: At an event where every layer evicts together, a policy that scores all layers at once (``scores_layers``) gets
#: them in chunks holding at most this many bytes of keys and values (its features take a few times that).
EVENT_BYTES = 256 * 2**20


class BudgetedCache(Cache):
    """KV cache that keeps at most ``budget + interval`` entries per (layer, KV head) under an eviction policy.

    A cache serves one sequence per row, as transformers' caches do: passed again to ``generate``, it continues the
    sequence it has seen (the inputs must extend it); a call that brings no new token (the same prompt again) is
    refused in one line. For a new prompt, build a new cache.

    Parameters
    ----------
    model
        The decoder the cache serves (its shape and attention are read; two forward hooks are installed once). A
        PEFT model or a module wrapper is unwrapped to the transformers model inside (:func:`foresight.models.base_model_of`).
    policy
        A registered policy name (``foresight policies``) or an :class:`EvictionPolicy` instance.
    budget, interval
        B and W of docs/runtime.md; ``budget=None`` never evicts.
    sinks
        The first ``sinks`` logical positions are never evicted.
    protect_prompt
        Never evict the first forward's tokens (the prompt); the budget applies on top of them.
    policy_kwargs
        Hyperparameters when ``policy`` is a name.
    meta
        Per-row context handed to ``policy.reset`` (e.g. ``trace_ids`` for the golden policy).
    """

    drives_forward = True  # the forward hooks (foresight.forward_hooks) act on caches that say so

    def __init__(
        self,
        model,
        policy: str | EvictionPolicy = "full",
        budget: int | None = None,
        interval: int | None = None,
        sinks: int = 0,
        protect_prompt: bool = False,
        policy_kwargs: dict | None = None,
        **meta,
    ):
        model = base_model_of(model)
        check_supported(model)
        num_layers, hq, hkv = model_shape(model)
        meta.setdefault("fingerprint", model_fingerprint(model))  # policies refuse artefacts of another model
        self._setup(num_layers, hq // hkv, policy, CacheConfig(budget, interval, sinks, protect_prompt), policy_kwargs, meta)
        self.rope = rope_of(model)  # lets policies read keys with RoPE undone (EvictView.prerope_keys)
        install_hooks(model)

    @classmethod
    def from_shape(
        cls, num_layers: int, num_groups: int, policy: str | EvictionPolicy, cfg: CacheConfig, **meta
    ) -> "BudgetedCache":
        """A cache driven by hand (:meth:`begin_step` / :meth:`end_step`), without a model: for tests and tools."""
        cache = cls.__new__(cls)
        cache._setup(num_layers, num_groups, policy, cfg, None, meta)
        return cache

    def _setup(self, num_layers, num_groups, policy, cfg: CacheConfig, policy_kwargs, meta) -> None:
        self.shared = SharedBuffers(num_layers)  # every layer's entries, in buffers shared by all layers
        self.rope: tuple[torch.Tensor, float] | None = None
        super().__init__(layers=self.shared.layers)
        if isinstance(policy, str):
            policy = make_policy(policy, **(policy_kwargs or {}))
        elif policy_kwargs:
            raise ValueError("policy_kwargs only apply to a policy given by name")
        self.policy = policy
        self.config = cfg
        self.num_groups = num_groups
        self.budget = cfg.budget if policy.evicts else None
        self.interval = cfg.interval
        if self.budget is not None:
            policy.check_cache(cfg.budget, cfg.interval)
        self._meta = meta
        self.offset = 0  # width of the protected prompt, set by the first forward when protect_prompt is on
        self.protect_len: torch.Tensor | None = None  # (batch,) positions below this are never evicted
        self.fed = 0  # tokens fed so far (padding included): the clock of the schedule
        self.step = 0
        self.events = 0
        self.evicted_entries = 0
        self.peak_entries = [0] * num_layers
        self._step_pos: torch.Tensor | None = None
        self._step_valid: torch.Tensor | None = None
        self._has_padding = False
        self._shared_mask: tuple[tuple[int, int], torch.Tensor | None] | None = None
        self._routed: list = []
        self.observer = Observer(policy, self.shared)  # hands queries to the policy (decode steps held)
        self.span: Span | None = None  # the next forward's layer-major span (foresight.layer_major)
        self.event_bytes = EVENT_BYTES  # keys + values of the layers a scores_layers policy scores at once

    # -- the schedule -------------------------------------------------------------------------------------------
    @property
    def target(self) -> int | None:
        """Entries kept after an event (``B``, plus the protected prompt's width)."""
        return None if self.budget is None else self.budget + self.offset

    def next_event(self) -> int | None:
        """Token count at which the next event fires (None: never)."""
        return next_event(self.fed, self.budget, self.interval, self.offset)

    def pieces(self, length: int, chunk: int | None = None) -> list[tuple[int, int, bool]]:
        """How to feed tokens ``fed .. length-1`` from here: :func:`~foresight.schedule.replay_schedule` pieces
        of at most ``chunk`` tokens (default ``W``) cut at this cache's event points."""
        return replay_schedule(length, self.budget, self.interval, chunk, start=self.fed, offset=self.offset)

    # -- one forward step ----------------------------------------------------------------------------------------
    def begin_step(self, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """Declare the logical positions (batch, q) and validity of the tokens the next forward appends.

        The validity of a decode step's token (one per row, after the first forward) is stored with its entry but
        not read back: decoding appends attendable tokens (``generate`` and ``model.generate`` add a 1 to the
        attention mask), and a read would make every decode step wait for the device."""
        if self.span is not None:
            self.span.declare(positions, valid)
            self.observer.flush(self.step)  # a span observes every piece at once: nothing may stay held
        self.observer.begin_step(first=self.fed == 0)
        if self.fed == 0:
            batch, q = positions.shape
            self.policy.reset(batch, len(self.layers), positions.device, num_groups=self.num_groups, **self._meta)
            if self.config.protect_prompt and self.budget is not None:
                self.offset = q
                self.protect_len = valid.sum(-1)
        self._step_pos = positions
        self._step_valid = valid
        self._shared_mask = None
        if not self._has_padding and (positions.shape[1] > 1 or self.fed == 0) and not bool(valid.all()):
            self._has_padding = True

    def end_step(self) -> None:
        """Close the forward step; fire the eviction event when the cache holds ``target + W`` entries."""
        self.observer.end_step(self._step_pos, self.step)
        if self.span is not None:
            self._end_span()
            return
        self.step += 1
        self.fed += self._step_pos.shape[1]
        for i, layer in enumerate(self.layers):
            n = layer.get_seq_length()
            if n > self.peak_entries[i]:
                self.peak_entries[i] = n
        due = self._due(self.length)
        if due or self.observer.over_cap(self.length):
            self.flush_observations()
        if due:
            self._evict(self.target, min(self.interval, self.length - 1))

    def detach_(self) -> None:
        """Cut the autograd history of every cached key and value: gradients of later pieces then stop at this
        point (truncated backpropagation through a replay with ``grad=True``)."""
        for layer in self.layers:
            layer.detach_()

    @property
    def length(self) -> int:
        """Entries held per (layer, KV head) now."""
        return self.layers[0].get_seq_length()

    def _due(self, n: int) -> bool:
        """True when a layer holding ``n`` entries is at an event (``target + W``)."""
        return self.budget is not None and n >= self.target + self.interval

    def _evict(self, target: int, protected_newest: int) -> None:
        """Evict every layer down to ``target`` entries, never touching the newest ``protected_newest``."""
        n = self.length
        if not self._evicts(n, target, protected_newest):
            return
        if self.policy.scores_layers:
            for layers in self._layer_chunks():
                self._evict_layers(layers, target, protected_newest)
        else:
            for layer_idx in range(len(self.layers)):
                self._evict_layer(layer_idx, target, protected_newest)
        self.events += 1
        self._count_evicted(n, target)
        self._end_event()

    def _end_event(self) -> None:
        """An event's one read from the device: whether padding is left (one read, only while some is), then the
        policy's :meth:`~foresight.policies.base.EvictionPolicy.end_event`."""
        if self._has_padding:
            self._has_padding = not bool(torch.stack([layer.valid.all() for layer in self.layers]).all())
        self.policy.end_event()

    @staticmethod
    def _evicts(n: int, target: int, protected_newest: int) -> bool:
        return n > target and n - protected_newest > 0 and target - protected_newest >= 0

    def _evict_layer(self, layer_idx: int, target: int, protected_newest: int) -> None:
        """Evict one layer down to ``target`` entries: the policy ranks, the layer gathers, the policy follows."""
        layer = self.layers[layer_idx]
        n = layer.get_seq_length()
        with torch.no_grad():  # decisions carry no gradient; only the kept entries' values do
            keep = self._choose(layer_idx, layer, n, n - protected_newest, target - protected_newest)
        layer.gather(keep)
        with torch.no_grad():
            self.policy.on_evict(layer_idx, keep)
        self._shared_mask = None

    def _layer_chunks(self) -> list[range]:
        """Consecutive layers scored at once (:meth:`_evict_layers`): as many as hold at most
        :attr:`event_bytes` of keys and values, at least one."""
        keys, values = self.layers[0].keys, self.layers[0].values  # (batch, Hkv, n, d) each
        per_layer = keys.numel() * keys.element_size() + values.numel() * values.element_size()
        size = max(1, self.event_bytes // max(per_layer, 1))
        return [range(i, min(i + size, len(self.layers))) for i in range(0, len(self.layers), size)]

    def _evict_layers(self, layers: range, target: int, protected_newest: int) -> None:
        """Evict the layers ``layers`` at once (a policy with ``scores_layers``): one :class:`EvictLayersView` of
        their stacked entries, one ``score_layers``, ``select`` over the stacked scores, one ``on_evict_layers``;
        the same kept entries as :meth:`_evict_layer` on each layer."""
        chosen, shared = [self.layers[i] for i in layers], self.shared
        n = chosen[0].get_seq_length()
        stacked = shared.holds(layers)
        if stacked:  # views of the shared buffers (no copy)
            tensors = [t[layers.start : layers.stop] for t in (shared.keys(n), shared.values(n), shared.positions(n),
                                                              shared.valid(n))]
        else:  # plain per-layer tensors (a step with gradients)
            tensors = [torch.stack([getattr(layer, name) for layer in chosen])
                       for name in ("keys", "values", "positions", "valid")]
        keys, values, positions, valid = tensors
        n_cand, n_keep = n - protected_newest, target - protected_newest
        view = EvictLayersView(layers=layers, keys=keys, values=values, positions=positions, valid=valid,
                               num_candidates=n_cand, num_keep=n_keep, event=self.events, step=self.step,
                               rope=self.rope, sinks=self.config.sinks, protect_len=self.protect_len)
        with torch.no_grad():
            keep = self._kept(view, self.policy.score_layers(view), self.policy.select)
        if stacked:
            shared.gather(layers, keep)
        else:
            for i, layer in enumerate(chosen):
                layer.gather(keep[i])
        with torch.no_grad():
            self.policy.on_evict_layers(layers, keep)
        self._shared_mask = None

    def _count_evicted(self, n: int, target: int) -> None:
        self.evicted_entries += (n - target) * self.layers[0].keys.shape[0] * self.layers[0].keys.shape[1]

    # -- dropping finished rows ------------------------------------------------------------------------------------
    @property
    def selects_rows(self) -> bool:
        """Whether :meth:`select_rows` may drop batch rows: the policy's per-row state follows them."""
        return self.policy.selects_rows

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (ascending indices into the current batch), between two forwards:
        :func:`foresight.generate` drops the rows that finished, so that later decode steps compute the others
        only. Every other row's entries, positions and events stay as they were (the schedule counts tokens fed,
        the same for every row)."""
        if not self.selects_rows:
            raise NotImplementedError(f"{type(self).__name__} with policy {self.policy.name!r} cannot drop batch rows")
        if self.span is not None or any(layer._buffers is None for layer in self.layers):
            raise RuntimeError("select_rows runs between forwards, on a cache recording no gradients")
        self.flush_observations()  # the held decode steps are the dropped rows' too
        self.shared.select_rows(rows)
        if self.protect_len is not None:
            self.protect_len = self.protect_len[rows]
        self.policy.select_rows(rows)
        self._shared_mask = None

    # -- layer-major spans (foresight.layer_major) ----------------------------------------------------------------
    def feed_span(self, pieces: list[Piece], detach: bool = False) -> None:
        """Make the next forward one layer-major span of this cache's schedule ``pieces`` (consecutive, from the
        tokens fed so far): each layer attends and evicts piece by piece inside it (``detach``: cutting its cached
        entries' autograd history after every piece, as :meth:`detach_` after each piecewise forward)."""
        if not pieces or pieces[0][0] != self.fed or any(a[1] != b[0] for a, b in zip(pieces, pieces[1:])):
            raise ValueError(f"a span must be consecutive pieces starting at token {self.fed}, got {pieces}")
        if self.config.protect_prompt and self.fed == 0:
            raise ValueError("a protected prompt is one forward of its own, not part of a layer-major span")
        num_layers = len(self.layers)
        self.span = Span(list(pieces), self.step, self.events, [0] * num_layers, [self._has_padding] * num_layers,
                         detach)

    def enter_piece(self, layer_idx: int, piece: int, key_states, value_states):
        """Layer-major: append piece ``piece`` of the span to layer ``layer_idx`` as that piece's piecewise forward
        would (its positions, step and event number); returns the layer's keys and values."""
        span = self.span
        s, e = span.bounds()[piece]
        self._step_pos, self._step_valid = span.positions[:, s:e], span.valid[:, s:e]
        self.step, self.events = span.step + piece, span.event + span.fired[layer_idx]
        span.padded[layer_idx] = span.padded[layer_idx] or span.piece_padded[piece]
        self._has_padding = span.padded[layer_idx]
        keys, values = self.layers[layer_idx].append(key_states, value_states, self._step_pos, self._step_valid)
        self.peak_entries[layer_idx] = max(self.peak_entries[layer_idx], keys.shape[2])
        return keys, values

    def leave_piece(self, layer_idx: int) -> None:
        """Layer-major: the layer's piece is over; evict the layer when it holds ``target + W`` entries."""
        span, layer = self.span, self.layers[layer_idx]
        n = layer.get_seq_length()
        protected = min(self.interval or 0, n - 1)
        if self._due(n) and self._evicts(n, self.target, protected):
            self._evict_layer(layer_idx, self.target, protected)
            span.fired[layer_idx] += 1
            if layer_idx == 0:
                self._count_evicted(n, self.target)
            if span.padded[layer_idx]:
                span.padded[layer_idx] = not bool(layer.valid.all())
        if span.detach:
            layer.detach_()

    def _end_span(self) -> None:
        """The span's forward is over: the counters stand where piecewise replay of its pieces leaves them."""
        span, self.span = self.span, None
        self.fed += span.length
        self.step = span.step + len(span.pieces)
        self.events = span.event + span.fired[0]
        self._has_padding = span.padded[0]
        self._shared_mask = None
        if span.fired[0]:
            self.policy.end_event()

    def _choose(self, layer_idx: int, layer: BudgetedLayer, n: int, n_cand: int, n_keep: int) -> torch.Tensor:
        """Indices (batch, Hkv, n_keep + newest) of the entries ``layer`` keeps, in cache order: the policy's
        :meth:`~foresight.policies.base.EvictionPolicy.keep` under the cache's rule (:meth:`_kept`)."""
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
            rope=self.rope,
            sinks=self.config.sinks,
            protect_len=self.protect_len,
        )
        return self.policy.keep(view, self._kept)

    def _kept(self, view, scores: torch.Tensor, select) -> torch.Tensor:
        """The entries kept (..., batch, Hkv, num_keep + newest), in cache order, given the policy's candidate
        ``scores`` and its ``select``: the cache's rule, :func:`~foresight.views.kept_entries`."""
        return kept_entries(view, scores, select)

    # -- called by transformers' attention modules ----------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if self.span is not None:  # appended piece by piece by the layer's span attention
            return key_states, value_states
        self.observer.appended(layer_idx, key_states.shape[2])
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
            mask = chunk_causal(q, n, layer.keys.device)[None, None]
            self._shared_mask = ((q, n), mask)
            return mask
        # Padding present: per-entry validity, causal inside the chunk; a query always sees itself so that
        # fully padded rows stay finite (their outputs are never used).
        causal = chunk_causal(q, n, layer.keys.device)
        mask = layer.valid[:, :, None, :] & causal
        mask[..., torch.arange(q), torch.arange(n - q, n)] = True
        g = self.num_groups
        return mask.repeat_interleave(g, dim=1) if g > 1 else mask

    def observe(self, layer_idx: int, query, keys, values, mask: torch.Tensor | None, scaling=None) -> None:
        """Hand the layer's new queries to the policy (:mod:`foresight.observer`: decode steps of policies that
        take all layers at once wait for the next event); ``mask`` is the one :meth:`attention_mask` gave SDPA."""
        self.observer.observe(layer_idx, query, keys, values, mask, scaling, self._step_pos, self.step,
                              hold=self.span is None)

    def flush_observations(self) -> None:
        """Hand every held decode step to the policy now. Events call it, and so do ``foresight.generate`` and
        ``replay`` when they finish; after ``model.generate``, call it before reading the policy's state (its
        statistics otherwise stop at the last event)."""
        self.observer.flush(self.step)

    # -- transformers Cache API -----------------------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens fed so far (evicted ones included): what transformers counts positions from."""
        return self.fed

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.layers[layer_idx].get_seq_length() + query_length, 0

    def stats(self) -> dict:
        """Cache statistics: peak entries per layer, eviction events, evicted entries (summed over heads)."""
        return {
            "peak_entries": list(self.peak_entries),
            "final_entries": self.length,
            "evictions": self.events,
            "evicted_entries": self.evicted_entries,
            "budget": self.config.budget,
            "interval": self.config.interval,
        }


__all__ = ["BudgetedCache", "BudgetedLayer", "EvictView", "StepView", "attention_probs"]
