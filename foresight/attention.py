"""The attention hook through which the budgeted cache sees every layer's queries and controls its mask.

We register an attention implementation named ``"foresight"`` with transformers' ``AttentionInterface``. While a
:class:`~foresight.cache.BudgetedCache` drives a forward pass (:func:`route`, called by the cache's forward hooks),
the model's attention modules use it, and it

1. hands the layer's post-RoPE (post q-norm) queries, the cache's keys/values and the module's logit scale to
   the cache's observer (the eviction policy), and
2. runs SDPA with the mask the cache builds from its own bookkeeping (padding entries, chunk causality). A policy
   with ``piece_bias``/``relaxed_attention`` methods (the relaxed eviction of ``foresight train e2e``,
   :mod:`training.e2e_policy`) computes the attention output itself instead: the cache still observes and evicts
   piece by piece, and the policy attends every token fed so far with a per-token additive bias, once per
   layer-major span (or piece).

transformers builds no mask of its own for an implementation name it does not know, so no work is wasted on a
mask we would throw away. With no routed cache the function is plain SDPA with the mask it is given. In a
layer-major span (:mod:`foresight.layer_major`) it runs the layer's attention piece by piece.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTN_IMPLEMENTATION = "foresight"
_ACTIVE: ContextVar[Any] = ContextVar("foresight_active_cache", default=None)
_REGISTERED = False


def foresight_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA attention that lets the routed budgeted cache observe queries and supply the mask."""
    cache = _ACTIVE.get()
    if cache is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if cache.span is not None:
        return span_attention(cache, module, query, key, value, kwargs)
    return attend(cache, module, query, key, value, kwargs)


def attend(cache, module, query, key, value, kwargs: dict):
    """One step of one layer through ``cache``: ``key``/``value`` are the layer's whole cache, the newest entries
    the step's own; the cache supplies the mask and hands the queries to its policy, then SDPA."""
    attention_mask = _observe(cache, module, query, key, value, kwargs)
    relaxed = getattr(cache.policy, "relaxed_attention", None)  # a relaxed eviction (training.e2e_policy) only
    if relaxed is not None:  # a span of one piece: the piece's own entries are the newest
        q = query.shape[2]
        return relaxed(module, query, key[:, :, -q:], value[:, :, -q:], kwargs)
    # Our mask already encodes causality inside the chunk; SDPA must not add its own top-left one.
    kwargs["is_causal"] = attention_mask is None and query.shape[2] > 1 and query.shape[2] == key.shape[2]
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _observe(cache, module, query, key, value, kwargs: dict) -> torch.Tensor | None:
    """The cache's mask for this step of the layer, after its policy observed the queries (and, for a relaxed
    eviction, recorded the bias the piece's queries see)."""
    layer_idx = module.layer_idx
    attention_mask = cache.attention_mask(layer_idx, query.shape[2], query.dtype)
    cache.observe(layer_idx, query, key, value, attention_mask, kwargs.get("scaling"))
    piece_bias = getattr(cache.policy, "piece_bias", None)
    if piece_bias is not None:
        piece_bias(layer_idx, key, query.shape[2])
    return attention_mask


def span_attention(cache, module, query, key, value, kwargs: dict):
    """Layer-major (:mod:`foresight.layer_major`): one layer's attention over a span of pieces, ``query``/``key``/
    ``value`` the span's (batch, heads, span, d). Piece by piece the cache appends the piece's entries, :func:`attend`
    runs as in a piecewise step, and the cache evicts the layer when the piece ends at an event. A relaxed eviction
    observes and evicts piece by piece and attends once for the whole span, after its pieces."""
    layer_idx = module.layer_idx
    relaxed = getattr(cache.policy, "relaxed_attention", None)
    sizes = [e - s for s, e in cache.span.bounds()]
    # split, not a slice per piece: under autograd each slice's backward fills a zero tensor of the whole span
    pieces = zip(query.split(sizes, dim=2), key.split(sizes, dim=2), value.split(sizes, dim=2))
    out = []
    for i, (q, k, v) in enumerate(pieces):
        keys, values = cache.enter_piece(layer_idx, i, k, v)
        if relaxed is None:
            out.append(attend(cache, module, q, keys, values, dict(kwargs))[0])
        else:
            _observe(cache, module, q, keys, values, kwargs)
        cache.leave_piece(layer_idx)
    if relaxed is not None:
        return relaxed(module, query, key, value, dict(kwargs))
    return torch.cat(out, dim=1), None


def register_attention() -> None:
    """Register the ``"foresight"`` attention implementation with transformers (idempotent)."""
    global _REGISTERED
    if not _REGISTERED:
        AttentionInterface.register(ATTN_IMPLEMENTATION, foresight_attention)
        _REGISTERED = True


def attention_configs(model) -> list:
    """Every distinct config object of ``model`` that selects an attention implementation."""
    found = {id(model.config): model.config}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            found.setdefault(id(cfg), cfg)
    return list(found.values())


def set_implementation(configs: list, name: str) -> list:
    """Select the registered attention ``name`` in every config of ``configs``; returns what
    :func:`restore_implementation` puts back."""
    saved = [(c, c._attn_implementation) for c in configs]
    for c, _ in saved:
        c._attn_implementation = name
    return saved


def restore_implementation(saved: list) -> None:
    for c, impl in saved:
        c._attn_implementation = impl


def route(configs: list, cache) -> tuple[Token, list]:
    """Send attention through :func:`foresight_attention` with ``cache`` active; undo with :func:`unroute`."""
    register_attention()
    return _ACTIVE.set(cache), set_implementation(configs, ATTN_IMPLEMENTATION)


def unroute(state: tuple[Token, list]) -> None:
    token, saved = state
    restore_implementation(saved)
    _ACTIVE.reset(token)
