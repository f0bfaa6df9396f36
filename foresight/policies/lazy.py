"""LazyEviction: lagged eviction with recurrence-interval tracking.

"LazyEviction: Lagged KV Eviction with Attention Pattern Observation for Efficient Long Reasoning",
https://arxiv.org/abs/2506.15969, code https://github.com/Halo-949/LazyEviction.

Two bookkeeping variants (``entry``), identical except for how a token starts and what is observed:

``published`` (default, the published code)
    A token fed at decode step ``t`` enters with ``last = t - 1``, ``mri = 0``; the cache already holds it when
    its own query attends, so that query activates it at once: ``mri = 1``, ``last = t``. The prompt's rows do
    not count: at the first decode step every prompt token stands at ``last = P - 1`` (the prefill step, which
    the published code counts as step 0) and ``mri = 0``, so only decode steps activate tokens.
``fresh`` (this project's earlier rule)
    Every token enters with ``last = t``, ``mri = 0``, so its own query leaves ``mri = 0`` (``t - last = 0``);
    every query row, prompt included, is observed and the prompt length is ignored.

The two rank a token that no later query attends (attended only once, by its own query) in opposite ways.
``published``: it keeps ``mri = 1``, so ``s2 = 2σ(0) = 1`` and its score stays in (1, 1.54]: above every token
that recurred at intervals of 3 or more (score < 1), it is among the last to go. ``fresh``: ``mri = 0``, so
``s2 = 0`` and ``s1 ≈ 0`` one step after entry: it is among the first to go. Under ``published`` only the
tokens no decode query ever activated (prompt tokens nobody looked at) keep ``mri = 0`` and go first.
``docs/policies.md`` compares the two on the same traces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foresight.policies._common import GROUP_REDUCTIONS, as_float, check_choice, reduce_group
from foresight.policies.base import EntryState, EvictionPolicy, check_range
from foresight.policies.registry import register_policy
from foresight.recurrence import activate

ENTRIES = ("published", "fresh")


@register_policy
@dataclass
class LazyEvictionPolicy(EvictionPolicy):
    """LazyEviction: keep tokens that recur (short maximum recurrence interval) or were activated recently.

    Every cached token carries ``last`` (the step it was last *activated*) and ``mri`` (its maximum recurrence
    interval). At every observed step ``t`` the query's attention ``a_t`` over the cache activates the tokens
    with ``a_t >= alpha``; for them ``mri = max(mri, t - last)`` and then ``last = t``. How a token enters and
    which steps are observed is ``entry`` (module docstring). At an eviction event the score is
    ``I = s1 + s2`` with ``s1 = 2·σ(-(1 + (t - last) / (mri + eps)))`` and ``s2 = 0 if mri == 0 else
    2·σ(1 - mri)``; the top scores are kept (plus the protected newest ``W``, the paper's lagged observation
    window).

    Steps are logical positions: query row ``i`` of a forward is step ``t`` = the position of the token it
    feeds, rows are processed in order, and a token exists from its own step on. So one forward of q rows
    (prefill, a replay piece) is exactly q consecutive decode steps, and replay with ``chunk=1`` and chunked
    replay give identical state and scores. Logical positions are the published step counter (which starts
    at 0 on the prefill) shifted by ``P - 1``, which changes no ``t - last`` and no ``mri``, so scores are the
    published ones. The prompt is known only when the caller passes ``prompt_lengths`` (one per batch row) to
    :meth:`reset` (the cache forwards its ``**meta``); without it ``P = 0`` and every token counts as
    generated. Under ``published`` the prompt's rows (positions ``< P``) are observed like decode steps, which
    only matters for an eviction event inside a prompt longer than ``B + W`` (the published code never
    compresses a prompt, and with no observation every prompt token would tie, the attention sink included);
    at each layer's first decode step (row ``P``) every prompt token is reset to ``last = P - 1``,
    ``mri = 0``, the published prefill state, so what the prompt's rows saw leaves no trace afterwards.

    Differences from the published code: it keeps one cache per *query* head and protects no sink tokens; we
    keep per-KV-head caches like every other policy here and reduce the GQA group's attention before the
    threshold (``group_reduce="max"``: a token is activated when any query head of its group attends to it
    with at least ``alpha``). It counts steps from 1 at the first decode step and evicts every ``W`` decode
    steps; we use logical positions and the runtime's schedule (by token count). The paper picks ``W`` so that
    it covers the MRI of ~80% of tokens; here ``W`` is the runtime's interval (:meth:`mri_quantile` reports
    the statistic to choose it).

    Parameters
    ----------
    alpha
        Activation threshold on the attention weight, > 0 (paper: 1e-4 .. 5e-4).
    eps
        Added to ``mri`` in the ``s1`` denominator, > 0 (the published code: 1e-5).
    group_reduce
        ``max``, ``mean`` or ``sum`` over the query heads of a GQA group.
    entry
        ``published`` (default) or ``fresh``: how tokens enter and whether the prompt is observed.
    """

    name = "lazy"
    per_layer = True
    selects_rows = True
    observes = True
    observes_layers = True
    alpha: float = 1e-4
    eps: float = 1e-5
    group_reduce: str = "max"
    entry: str = "published"

    def __post_init__(self):
        self.alpha, self.eps = as_float("alpha", self.alpha), as_float("eps", self.eps)
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0 (an attention threshold), got {self.alpha!r}")
        check_range("alpha", self.alpha, 0.0, 1.0)
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps!r}")
        check_choice("group_reduce", self.group_reduce, GROUP_REDUCTIONS)
        check_choice("entry", self.entry, ENTRIES)

    def reset(self, batch_size, num_layers, device, prompt_lengths=None, **meta):
        self.state = EntryState()
        self.state.reset(num_layers)
        self._t: list[torch.Tensor | None] = [None] * num_layers
        self._prompt = None  # (b,) prompt lengths, only under `published` and only when some are > 0
        if self.entry == "published" and prompt_lengths is not None:
            p = torch.as_tensor(prompt_lengths, dtype=torch.long, device=device).flatten()
            if p.numel() == 1:
                p = p.expand(batch_size)
            if p.shape != (batch_size,) or bool((p < 0).any()):
                raise ValueError(f"prompt_lengths must be {batch_size} integers >= 0, got {prompt_lengths!r}")
            self._prompt = p.clone() if bool((p > 0).any()) else None
        # per layer: (b,) rows whose prompt tokens were already reset at their first decode step
        self._decoding: list[torch.Tensor | None] = [None] * num_layers
        self._past_prompt = [self._prompt is None] * num_layers  # every row decodes: the prompt rule is done
        # last and mri of every layer in capacity buffers (L, b, Hkv, capacity), entries past a layer's `_n` kept
        # at mri = 0: a decode step appends and updates in place, for one layer or all layers at once
        self._last: torch.Tensor | None = None
        self._mri: torch.Tensor | None = None
        self._n = [0] * num_layers

    def select_rows(self, rows):
        if self._last is not None:
            self._attach(self._last.index_select(1, rows), self._mri.index_select(1, rows))
        self._t = [None if t is None else t.index_select(0, rows) for t in self._t]
        self._decoding = [None if d is None else d.index_select(0, rows) for d in self._decoding]
        if self._prompt is not None:
            self._prompt = self._prompt.index_select(0, rows)

    def observe(self, view):
        layer = view.layer_idx
        a = reduce_group(view.probs, self.group_reduce)  # (b, Hkv, q, n)
        # integer steps (logical positions): exact, and no casts on the per-step path
        last, mri = self._grow(layer, view.positions, a.shape[-1])
        act = a >= self.alpha
        t = view.query_positions  # (b, q)
        if self._past_prompt[layer]:
            activate(last, mri, act, t[:, None, :, None])
        else:
            # Published: the prompt's rows first (in order they precede every decode row), then the reset of the
            # prompt tokens to the prefill state at each row's first decode step, then the decode rows.
            prompt_rows = t < self._prompt[:, None]  # (b, q)
            if bool(prompt_rows.any()):
                activate(last, mri, act & prompt_rows[:, None, :, None], t[:, None, :, None])
            if not bool(prompt_rows.all()):
                decoding = self._decoding[layer]
                if decoding is None:
                    decoding = torch.zeros_like(self._prompt, dtype=torch.bool)
                starting = ~decoding & ~prompt_rows.all(dim=-1)  # (b,) first decode step in this forward
                if bool(starting.any()):
                    p = self._prompt[:, None, None]
                    reset = starting[:, None, None] & (view.positions[..., : last.shape[-1]] < p)
                    torch.where(reset, p - 1, last, out=last)
                    mri.masked_fill_(reset, 0)
                    self._decoding[layer] = decoding = decoding | starting
                    # positions only grow, so once every row decodes no later row is a prompt row
                    self._past_prompt[layer] = bool(decoding.all())
                activate(last, mri, act & ~prompt_rows[:, None, :, None], t[:, None, :, None])
        self.state.set(layer, "last", last)
        self.state.set(layer, "mri", mri)
        self._t[layer] = t[:, -1]

    def observe_layers(self, view):
        n = view.keys.shape[-2]
        if not all(self._past_prompt) or len(set(self._n)) != 1 or self._n[0] >= n:
            return super().observe_layers(view)  # the published prompt rule, or layers out of step: one by one
        have = self._n[0]
        self._reserve(view.positions[0], n)
        last, mri = self._last[..., :n], self._mri[..., :n]
        torch.sub(view.positions[..., have:n], 0 if self.entry == "fresh" else 1, out=last[..., have:n])
        act = reduce_group(view.probs, self.group_reduce, dim=3) >= self.alpha  # (L, b, Hkv, k, n)
        t = view.query_positions  # (b, k)
        activate(last, mri, act, t[:, None, :, None])  # every layer at once
        for layer in range(len(self._n)):
            self._n[layer] = n
            self.state.set(layer, "last", last[layer])
            self.state.set(layer, "mri", mri[layer])
            self._t[layer] = t[:, -1]

    def _reserve(self, like: torch.Tensor, n: int) -> None:
        """Room for ``n`` entries in every layer (``like``: one layer's (b, Hkv, n) positions)."""
        cur = self._last
        if cur is not None and n <= cur.shape[-1] and cur.shape[1:3] == like.shape[:2]:
            return
        cap = 0 if cur is None else cur.shape[-1]
        grown = [like.new_zeros(len(self._n), *like.shape[:2], max(n, 2 * cap, 64)) for _ in range(2)]
        if cur is not None:
            grown[0][..., :cap], grown[1][..., :cap] = self._last, self._mri
        self._attach(*grown)

    def _attach(self, last: torch.Tensor, mri: torch.Tensor) -> None:
        """Make ``last`` and ``mri`` (L, b, Hkv, capacity) the buffers; the state's tensors are views of them."""
        self._last, self._mri = last, mri
        for layer, have in enumerate(self._n):
            self.state.set(layer, "last", last[layer, ..., :have])
            self.state.set(layer, "mri", mri[layer, ..., :have])

    def _grow(self, layer: int, positions: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``last``/``mri`` over the cache's ``n`` entries, views of the layer's buffers (new entries:
        ``last = t - 1`` or ``t``, ``mri = 0``)."""
        have = self._n[layer]
        self._reserve(positions, n)
        last, mri = self._last[layer, ..., :n], self._mri[layer, ..., :n]
        if have < n:
            torch.sub(positions[..., have:n], 0 if self.entry == "fresh" else 1, out=last[..., have:n])
        self._n[layer] = n
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
        if self._last is None:
            return
        k, n = keep.shape[-1], self._n[layer_idx]
        for buf in (self._last[layer_idx], self._mri[layer_idx]):
            buf[..., :k] = buf[..., :n].gather(-1, keep)
        self._mri[layer_idx, ..., k:n].zero_()
        self._n[layer_idx] = k
        self.state.set(layer_idx, "last", self._last[layer_idx, ..., :k])
        self.state.set(layer_idx, "mri", self._mri[layer_idx, ..., :k])

    def mri_quantile(self, q: float = 0.8) -> float:
        """The ``q``-quantile of the MRI over all cached tokens that recurred (the paper sizes ``W`` by it)."""
        vals = [d["mri"][d["mri"] > 0].flatten().float() for d in self.state.tensors if "mri" in d]
        vals = torch.cat(vals) if vals else torch.zeros(0)
        return float(vals.quantile(q)) if vals.numel() else 0.0
