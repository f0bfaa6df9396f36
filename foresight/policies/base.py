"""The eviction-policy interface shared by every heuristic, the golden replay and the learned scorer.

A policy is a dataclass (its fields are its validated hyperparameters) with up to four hooks:

* :meth:`EvictionPolicy.reset` when a new batch of sequences starts;
* :meth:`EvictionPolicy.observe` on every forward step of every layer, with the new tokens' post-RoPE queries
  (only called when ``observes = True``, so policies that need no attention cost nothing); a policy that sets
  ``observes_layers = True`` gets a decode step of every layer at once instead (:meth:`EvictionPolicy.observe_layers`,
  one batched attention, no per-layer calls), and must leave the same state as ``observe`` layer by layer;
* :meth:`EvictionPolicy.score` at an eviction event: one score per candidate, higher = keep (the runtime asks
  :meth:`EvictionPolicy.keep`, which ranks them and applies ``select``);
* :meth:`EvictionPolicy.on_evict` after the runtime gathered the kept entries, so per-entry state stays
  aligned with the cache. :class:`EntryState` does that bookkeeping for the common case.

A policy that sets ``scores_layers = True`` is asked once for all layers at an event where every layer evicts
together (a decode step's, a piecewise replay's): :meth:`EvictionPolicy.score_layers` scores them, ``select`` picks
among the stacked scores and :meth:`EvictionPolicy.on_evict_layers` follows, one batched pass instead of one per
layer; the result must equal ``score``, ``select`` and ``on_evict`` layer by layer.

The runtime owns the mechanics (candidates, protected newest window, sinks, padding, top-k); policies only rank.

A policy that sets ``per_layer = True`` promises that what it decides at layer ``l`` depends on layer ``l``'s
observations and its own per-layer state alone (no generator or statistic shared across layers): replay may then
call its hooks layer by layer over many pieces (layer-major replay, :mod:`foresight.layer_major`) instead of
piece by piece over every layer, and gets the same result. Policies that do not say so are replayed piecewise.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch

from foresight.config import MAX_SEED
from foresight.errors import ForesightError
from foresight.sampling import top_keep
from foresight.views import EvictLayersView, EvictView, LayersView, StepView, kept_entries


@dataclass
class EvictionPolicy:
    """Base class. Subclasses set ``name`` and implement :meth:`score`."""

    name: ClassVar[str] = ""
    observes: ClassVar[bool] = False
    observes_layers: ClassVar[bool] = False  # takes decode steps through observe_layers (all layers at once)
    evicts: ClassVar[bool] = True
    replay_only: ClassVar[bool] = False
    per_layer: ClassVar[bool] = False  # decides each layer from that layer alone (module docstring)
    scores_layers: ClassVar[bool] = False  # scores every layer of an event at once (score_layers)
    selects_rows: ClassVar[bool] = False  # its per-row state follows select_rows (generate drops finished rows)

    def reset(self, batch_size: int, num_layers: int, device: torch.device, **meta) -> None:
        """Start a new batch of sequences; ``meta`` carries optional per-row context (e.g. trace ids)."""

    def check_cache(self, budget: int | None, interval: int | None) -> None:
        """Raise ``ValueError`` if the policy cannot run with budget ``B`` / interval ``W`` (default: any)."""

    def observe(self, view: StepView) -> None:
        """See one layer's new queries (only when ``observes`` is True)."""

    def observe_layers(self, view: LayersView) -> None:
        """See every layer's new query of one decode step (only when ``observes_layers`` is True); the result must
        equal :meth:`observe` on ``view.layer(i)`` for each layer ``i``, which is what this default does."""
        for i in range(view.num_layers):
            self.observe(view.layer(i))

    def score(self, view: EvictView) -> torch.Tensor:
        """Return (batch, Hkv, num_candidates) scores, higher = keep."""
        raise NotImplementedError

    def select(self, scores: torch.Tensor, num_keep: int, view: EvictView) -> torch.Tensor:
        """Pick ``num_keep`` candidate indices per (batch, head); default: deterministic top-k, ties keeping the
        older entry on every device (:func:`~foresight.sampling.top_keep`)."""
        return top_keep(scores, num_keep)

    def keep(self, view: EvictView, rule=kept_entries) -> torch.Tensor:
        """The entries the layer of ``view`` keeps, (batch, Hkv, num_keep + protected newest) in cache order: the
        cache's ``rule(view, scores, select)`` (:func:`~foresight.views.kept_entries`) over :meth:`score` with
        :meth:`select`. A policy may compute the same in one step (the learned policy's compiled events)."""
        return rule(view, self.score(view), self.select)

    def score_layers(self, view: EvictLayersView) -> torch.Tensor:
        """Return (L, batch, Hkv, num_candidates) scores of the layers ``view.layers`` at once (only called when
        ``scores_layers`` is True); they must equal :meth:`score` on each ``view.layer(i)``."""
        raise NotImplementedError

    def on_evict(self, layer_idx: int, keep: torch.Tensor) -> None:
        """The layer now holds entries ``keep`` (batch, Hkv, k) of its previous content, in that order."""

    def on_evict_layers(self, layers: range, keep: torch.Tensor) -> None:
        """The layers ``layers`` now hold entries ``keep`` (L, batch, Hkv, k) (after :meth:`score_layers`); this
        default calls :meth:`on_evict` layer by layer."""
        for i, layer_idx in enumerate(layers):
            self.on_evict(layer_idx, keep[i])

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (ascending indices into the current batch) of the per-row state; called
        by :meth:`foresight.cache.BudgetedCache.select_rows` when :func:`foresight.generate` drops finished rows,
        only for a policy that sets ``selects_rows`` (what it decides for a row must not depend on the other rows
        or on the batch's size). This default keeps no state; a policy with per-row state overrides it."""

    def end_event(self) -> None:
        """Every layer has been evicted at an event (after a layer-major span: at all of the span's events). The one
        place where a policy may read device values back (checks, statistics): the other hooks run inside decode
        steps and evictions, which never wait for the device (:mod:`foresight.generation`)."""

    def config(self) -> dict:
        """Hyperparameters as a plain dict (recorded with results)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init and not f.name.startswith("_")}


@dataclass
class EntryState:
    """Per-entry tensors (batch, Hkv, n) per layer, kept aligned with the cache through every eviction."""

    tensors: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def reset(self, num_layers: int) -> None:
        self.tensors = [{} for _ in range(num_layers)]

    def get(self, layer_idx: int, name: str) -> torch.Tensor | None:
        return self.tensors[layer_idx].get(name)

    def set(self, layer_idx: int, name: str, value: torch.Tensor) -> None:
        self.tensors[layer_idx][name] = value

    def extend(self, layer_idx: int, name: str, n: int, fill: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Grow ``name`` to ``n`` entries (new entries = ``fill``) and return it; created on first use."""
        cur = self.tensors[layer_idx].get(name)
        have = 0 if cur is None else cur.shape[-1]
        if have < n:
            shape = (*like.shape[:2], n - have)
            if isinstance(fill, torch.Tensor):
                new = fill.to(like.dtype).expand(shape)
            else:
                new = torch.full(shape, fill, dtype=like.dtype, device=like.device)
            cur = new.clone() if cur is None else torch.cat([cur, new], dim=-1)
            self.tensors[layer_idx][name] = cur
        return cur

    def gather(self, layer_idx: int, keep: torch.Tensor) -> None:
        for name, t in self.tensors[layer_idx].items():
            self.tensors[layer_idx][name] = t.gather(-1, keep)


def require_cache(policy: "EvictionPolicy", budget: int | None, interval: int | None) -> None:
    """:meth:`EvictionPolicy.check_cache` for jobs that check every policy before any compute or output: the
    refusal (e.g. a scorer trained at another B, W) becomes a one-line :class:`ForesightError` naming the policy."""
    try:
        policy.check_cache(budget, interval)
    except ValueError as exc:
        raise ForesightError(f"policy {policy.name!r}: {exc}") from None


def check_seed(value: int) -> None:
    """Refuse a policy seed torch's generators cannot take (``ValueError`` naming it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {value!r}")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    """Raise ``ValueError`` with a readable message when ``value`` is outside [lo, hi]."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{name} must be in {bounds}, got {value!r}")
