"""What a policy sees: read-only views of one layer at a forward step and at an eviction event.

This module sits at the bottom of the house: the cache builds these views (per layer, or of every layer at once
for a decode step), the ``"foresight"`` attention function hands queries to the cache, and policies and the
feature extractor read the views. It imports nothing from the package, so none of them has to import another to
share these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch


def attention_probs(
    query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, scaling: float | None = None
) -> torch.Tensor:
    """Softmax attention of ``query`` over ``keys`` in fp32, grouped by KV head.

    Parameters
    ----------
    query
        (batch, Hq, q, d) post-RoPE queries.
    keys
        (batch, Hkv, n, d) cached keys.
    mask
        Boolean (batch, 1 or Hq, q, n) mask, True = may attend; None = attend everywhere.
    scaling
        The attention module's own logit scale (``module.scaling``); ``d**-0.5`` when not given.

    Returns
    -------
    torch.Tensor
        (batch, Hkv, G, q, n) attention probabilities, G = Hq / Hkv.
    """
    b, hq, q, d = query.shape
    hkv, n = keys.shape[1], keys.shape[2]
    g = hq // hkv
    scale = scaling if scaling is not None else d**-0.5
    qg = (query.float() * scale).reshape(b, hkv, g * q, d)  # scale the q rows, not the (q, n) logits
    logits = torch.matmul(qg, keys.float().transpose(-1, -2)).view(b, hkv, g, q, n)
    if mask is None:  # no row can be fully masked
        return torch.softmax(logits, dim=-1)
    mb = mask.shape[0]  # 1 for the shared chunk-causal mask, b for per-row padding masks
    m = mask.view(mb, 1, 1, q, n) if mask.shape[1] == 1 else mask.view(mb, hkv, g, q, n)
    return torch.softmax(logits.masked_fill(~m, float("-inf")), dim=-1).nan_to_num_(0.0)


def unrotate_keys(keys: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float) -> torch.Tensor:
    """Undo rotary position embedding (RoPE; Su et al. 2021, https://arxiv.org/abs/2104.09864) on cached keys.

    The cache stores keys after RoPE, in transformers' ``rotate_half`` layout: ``k' = s (k cos + rot(k) sin)``
    with angles ``position * inv_freq`` (``s`` the embedding's ``attention_scaling``). Rotating back by the
    entry's logical position gives what the projection (and k-norm) produced, the same vector wherever the
    token stands. ``keys`` (..., n, d), ``positions`` (..., n); returns fp32 (..., n, d).
    """
    angles = positions.float()[..., None] * inv_freq.to(device=keys.device, dtype=torch.float32)
    angles = torch.cat([angles, angles], dim=-1)
    k = keys.float()
    half = k.shape[-1] // 2
    rotated = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    return (k * angles.cos() - rotated * angles.sin()) / scaling


def kept_entries(view, scores: torch.Tensor, select) -> torch.Tensor:
    """The entries a layer (or the stacked layers of an :class:`EvictLayersView`) keeps at an event, (..., batch,
    Hkv, num_keep + protected newest) indices in cache order, from a policy's candidate ``scores`` (higher = keep):
    padding goes first (``-inf``), the sinks and the protected prompt stay (``+inf``), ``select(scores, num_keep,
    view)`` (the policy's selection) picks among the rest, and the protected newest entries stay. The cache's rule,
    and what a policy that ranks and selects in one step (the learned policy's compiled events) computes."""
    c, valid, positions = view.num_candidates, view.valid[..., : view.num_candidates], view.candidate_positions
    scores = scores.float().masked_fill(~valid, float("-inf"))
    protected = positions < view.sinks
    if view.protect_len is not None:
        protected = protected | (positions < view.protect_len[:, None, None])
    keep = select(scores.masked_fill(protected & valid, float("inf")), view.num_keep, view).sort(dim=-1).values
    newest = torch.arange(c, view.keys.shape[-2], device=keep.device).expand(*keep.shape[:-1], -1)
    return torch.cat([keep, newest], dim=-1)


def chunk_causal(q: int, n: int, device) -> torch.Tensor:
    """(q, n) mask: the q newest entries are the queries themselves (causal), older entries all visible."""
    j = torch.arange(n, device=device)
    i = torch.arange(q, device=device)
    return j[None, :] <= (n - q + i)[:, None]


@dataclass
class StepView:
    """What a policy sees of one layer during a forward step (read-only).

    ``query`` holds the post-RoPE queries of the step's new tokens (batch, Hq, q, d); ``keys``/``values`` the
    whole cache of the layer including the new tokens (batch, Hkv, n, d); ``positions``/``valid`` the per-entry
    logical positions and validity (batch, Hkv, n); ``query_positions`` the new tokens' positions (batch, q);
    ``scaling`` the attention module's logit scale.
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
    scaling: float | None = None
    _probs: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_groups(self) -> int:
        return self.query.shape[1] // self.keys.shape[1]

    @property
    def probs(self) -> torch.Tensor:
        """fp32 attention of the new queries over the cache, (batch, Hkv, G, q, n); computed once, shared."""
        if self._probs is None:
            self._probs = attention_probs(self.query, self.keys, self.mask, self.scaling)
        return self._probs


@dataclass
class LayersView:
    """What a policy sees of *every* layer at once: one or more decode steps (read-only; ``observe_layers``).

    The cache hands it over at an event with the decode steps it held since the last one (one query row per
    sequence and step, no padding): ``query`` (L, batch, Hq, k, d) the post-RoPE queries of every layer for the
    k held steps, ``keys`` (L, batch, Hkv, n, d) and ``positions``/``valid`` (L, batch, Hkv, n) every layer's
    cache, whose newest k entries are those steps' own tokens, ``query_positions`` (batch, k), ``mask`` the
    chunk-causal (1, 1, k, n) mask (None for one step). :attr:`probs` is the attention of all layers in one
    batched product, equal bit for bit to each layer's :attr:`StepView.probs`; :meth:`layer` is one layer's
    :class:`StepView` of it.
    """

    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    query_positions: torch.Tensor
    step: int
    scaling: float | None = None
    mask: torch.Tensor | None = None
    _probs: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def probs(self) -> torch.Tensor:
        """fp32 attention of every layer's queries over its cache, (L, batch, Hkv, G, k, n); computed once."""
        if self._probs is None:
            lb = self.keys.shape[:2]
            flat = attention_probs(self.query.flatten(0, 1), self.keys.flatten(0, 1), self.mask, self.scaling)
            self._probs = flat.unflatten(0, lb)
        return self._probs

    def layer(self, i: int) -> StepView:
        """Layer ``i``'s :class:`StepView` (sharing :attr:`probs` once they are computed)."""
        return StepView(layer_idx=i, query=self.query[i], keys=self.keys[i], values=self.values[i],
                        positions=self.positions[i], valid=self.valid[i], query_positions=self.query_positions,
                        mask=self.mask, step=self.step, scaling=self.scaling,
                        _probs=None if self._probs is None else self._probs[i])


_PER_ENTRY = ("keys", "values", "positions", "valid")  # the event views' tensors with an entry dimension


@dataclass
class _EventEntries:
    """The fields both event views share, and what they derive from them: the candidates' positions and the
    protected newest entries."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    num_candidates: int
    num_keep: int
    event: int
    step: int
    rope: tuple[torch.Tensor, float] | None = None
    sinks: int = 0  # entries at positions below this are never evicted (the cache's attention sinks)
    protect_len: torch.Tensor | None = None  # (batch,): nor those below each row's protected prompt length

    @property
    def candidate_positions(self) -> torch.Tensor:
        return self.positions[..., : self.num_candidates]

    @property
    def num_protected(self) -> int:
        """The newest entries that are not candidates (the interval ``W`` at a regular event)."""
        return self.keys.shape[-2] - self.num_candidates


@dataclass
class EvictView(_EventEntries):
    """What a policy sees of one layer (``layer_idx``, keyword-only) at an eviction event.

    The candidates are the first ``num_candidates`` entries (everything but the newest ``interval``); the
    policy returns one score per candidate, higher = keep. ``keys``/``values``/``positions``/``valid`` cover the
    whole layer (batch, Hkv, n[, d]) so policies can use the protected window as context. ``rope`` is the
    model's rotary embedding (``inv_freq``, ``attention_scaling``) when the cache serves a model whose RoPE
    frequencies do not depend on the sequence length (see :meth:`prerope_keys`), else None.
    """

    layer_idx: int = field(kw_only=True)

    def prerope_keys(self, c: int) -> torch.Tensor:
        """The first ``c`` entries' keys with RoPE undone (:func:`unrotate_keys`), (batch, Hkv, c, d) fp32."""
        if self.rope is None:
            raise ValueError("pre-RoPE keys need the rotary embedding of the model the cache serves (a cache "
                             "built from a model with static RoPE frequencies, not BudgetedCache.from_shape)")
        inv_freq, scaling = self.rope
        return unrotate_keys(self.keys[..., :c, :], self.positions[..., :c], inv_freq, scaling)


@dataclass
class EvictLayersView(_EventEntries):
    """What a policy sees of consecutive layers ``layers`` (keyword-only) at one eviction event, all at once
    (``score_layers``).

    At an event of a decode step or a piecewise replay every layer holds the same number of entries and evicts
    together, so their tensors stack: ``keys``/``values`` (L, batch, Hkv, n, d), ``positions``/``valid`` (L, batch,
    Hkv, n), with ``L = len(layers)``; the other fields are :class:`EvictView`'s. :meth:`folded` is the same event
    with the layers folded into the batch, (L * batch, Hkv, n[, d]): a computation written for one layer's
    :class:`EvictView` that treats rows independently runs on it unchanged, once for every layer.
    """

    layers: range = field(kw_only=True)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def _view(self, layer_idx: int, pick) -> EvictView:
        """An :class:`EvictView` of this event with ``pick`` applied to each tensor with an entry dimension."""
        shared = {f.name: getattr(self, f.name) for f in fields(_EventEntries)}
        shared.update({name: pick(shared[name]) for name in _PER_ENTRY})
        return EvictView(layer_idx=layer_idx, **shared)

    def folded(self) -> EvictView:
        """The event's layers folded into the batch (``layer_idx`` -1: no single layer)."""
        view = self._view(-1, lambda t: t.flatten(0, 1))
        if view.protect_len is not None:  # a row's protected prompt, for each layer's copy of the row
            view.protect_len = view.protect_len.repeat(self.num_layers)
        return view

    def layer(self, i: int) -> EvictView:
        """The :class:`EvictView` of the ``i``-th of these layers (model layer ``layers[i]``)."""
        return self._view(self.layers[i], lambda t: t[i])
