"""The attention hook through which the runtime sees every layer's queries and controls its mask.

We register an attention implementation named ``"foresight"`` with transformers' ``AttentionInterface``. While a
:class:`~foresight.cache.BudgetedCache` is active (a context variable set by the runtime), it

1. hands the layer's post-RoPE (post q-norm) queries and the cache's keys/values to the cache's observer
   (the eviction policy), and
2. runs SDPA with the mask the cache builds from its own bookkeeping (padding entries, chunk causality).

transformers builds no mask of its own for an implementation name it does not know, so no work is wasted on a
mask we would throw away. With no active cache the function is plain SDPA with the mask it is given.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:
    from foresight.cache import BudgetedCache

ATTN_IMPLEMENTATION = "foresight"
_ACTIVE: ContextVar["BudgetedCache | None"] = ContextVar("foresight_active_cache", default=None)
_REGISTERED = False


def foresight_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA attention that lets the active budgeted cache observe queries and supply the mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = _ACTIVE.get()
    if cache is not None:
        layer_idx = module.layer_idx
        attention_mask = cache.attention_mask(layer_idx, query.shape[2], query.dtype)
        cache.observe(layer_idx, query, key, value, attention_mask)
        # Our mask already encodes causality inside the chunk; SDPA must not add its own top-left one.
        kwargs["is_causal"] = attention_mask is None and query.shape[2] > 1 and query.shape[2] == key.shape[2]
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_attention() -> None:
    """Register the ``"foresight"`` attention implementation with transformers (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, foresight_attention)
    _REGISTERED = True


@contextmanager
def activate(model, cache: "BudgetedCache") -> Iterator[None]:
    """Route ``model``'s attention through :func:`foresight_attention` with ``cache`` active."""
    register_attention()
    configs = {id(c): c for c in _attn_configs(model)}.values()
    saved = [(c, c._attn_implementation) for c in configs]
    token = _ACTIVE.set(cache)
    try:
        for c, _ in saved:
            c._attn_implementation = ATTN_IMPLEMENTATION
        yield
    finally:
        for c, impl in saved:
            c._attn_implementation = impl
        _ACTIVE.reset(token)


def _attn_configs(model):
    yield model.config
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            yield cfg


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
