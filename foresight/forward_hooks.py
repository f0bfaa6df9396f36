"""Forward hooks through which a :class:`~foresight.cache.BudgetedCache` drives a model's forward, ours or
``transformers``' ``generate``.

Installed once per model (:func:`install_hooks`), they act only when the forward's ``past_key_values`` is a budgeted
cache (anything with ``drives_forward = True``), so the model is untouched otherwise:

* before the forward: take the new tokens' logical positions and validity from ``position_ids`` /
  ``attention_mask`` (HF's conventions, left padding included) and declare them to the cache; when the forward
  would cross an eviction event (a prompt longer than B+W), feed the leading pieces first, cut at the event points
  of :mod:`foresight.schedule` (chunked prefill); route attention through :mod:`foresight.attention`;
* after it: undo the routing and close the cache's step, which fires the event when one is due.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from foresight.attention import attention_configs, route, unroute
from foresight.errors import ForesightError

_HOOKED = "_foresight_hooks"
# each hooked model's attention configs, found once; keyed by the model (not captured by the hook) so that a
# copy.deepcopy of the model, which copies its hooks, routes its own configs
_CONFIGS: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()


def _drives(cache) -> bool:
    return getattr(cache, "drives_forward", False)


def install_hooks(model) -> None:
    """Install the forward hooks on ``model`` once; they act only when a budgeted cache drives the forward."""
    if getattr(model, _HOOKED, None) is not None:
        return
    pre = model.register_forward_pre_hook(_before_forward, with_kwargs=True)
    post = model.register_forward_hook(_after_forward, with_kwargs=True, always_call=True)
    setattr(model, _HOOKED, (pre, post))


def _step_inputs(cache, ids: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Logical positions and validity (batch, q) of a forward's new tokens, from its keyword arguments."""
    batch, q = ids.shape[:2]
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() != 2:
        raise ForesightError("BudgetedCache needs a 2-D attention_mask (batch, tokens) or none")
    valid = torch.ones(batch, q, dtype=torch.bool, device=ids.device) if mask is None else mask[:, -q:].bool()
    positions = kwargs.get("position_ids")
    if positions is None:
        if mask is not None:
            positions = (mask.long().cumsum(-1) - 1).clamp_(min=0)[:, -q:]
        else:
            positions = (torch.arange(q, device=ids.device) + cache.fed)[None].expand(batch, -1)
    return positions, valid


def _before_forward(model, args, kwargs):
    cache = kwargs.get("past_key_values")
    if not _drives(cache):
        return None
    configs = _CONFIGS.get(model)
    if configs is None:
        configs = _CONFIGS[model] = attention_configs(model)
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs["inputs_embeds"]
    if args:
        kwargs["input_ids"], args = args[0], args[1:]
    q = ids.shape[1]
    if q == 0 and cache.fed:  # generate with a used cache and a prompt it has seen: nothing new to feed
        raise ForesightError(f"this BudgetedCache has already seen {cache.fed} tokens and the call brings no new one; "
                             "build a new BudgetedCache for a new prompt (a used cache only continues the sequence "
                             "it has seen)")
    event = cache.next_event()
    if event is not None and cache.fed + q > event and cache.span is None:  # a layer-major span evicts inside
        kwargs = _prefill_in_pieces(model, cache, kwargs, q)
    positions, valid = _step_inputs(cache, kwargs.get("input_ids", kwargs.get("inputs_embeds")), kwargs)
    kwargs["position_ids"] = positions
    kwargs["use_cache"] = True
    cache.begin_step(positions, valid)
    cache._routed.append(route(configs, cache))
    return args, kwargs


def _prefill_in_pieces(model, cache, kwargs: dict, q: int) -> dict:
    """Feed all but the last schedule piece of an over-long forward; return the kwargs of the last piece.

    Only the last piece's logits come back, so this is allowed when the caller asks for the last position's
    logits only (``logits_to_keep=1``, as ``generate`` does); feed pieces yourself (:func:`foresight.replay`)
    to get logits of every position.
    """
    # The first forward of a protected prompt is never cut: its tokens are never evicted.
    if cache.config.protect_prompt and cache.fed == 0:
        return kwargs
    if kwargs.get("logits_to_keep") != 1:
        raise ForesightError(
            f"a forward of {q} tokens would cross the eviction event at token {cache.next_event()} "
            f"(B={cache.budget}, W={cache.interval}); pass logits_to_keep=1 (as generate does) or feed it in "
            "pieces with foresight.replay"
        )
    key = "input_ids" if kwargs.get("input_ids") is not None else "inputs_embeds"
    seq = kwargs[key]
    mask = kwargs.get("attention_mask")
    positions, _ = _step_inputs(cache, seq, kwargs)
    start = cache.fed
    end = start + q
    pieces = cache.pieces(end, chunk=q)
    fixed = {k: v for k, v in kwargs.items() if k not in (key, "attention_mask", "position_ids", "cache_position")}
    for a, b, _ in pieces[:-1]:
        piece = {key: seq[:, a - start : b - start], "position_ids": positions[:, a - start : b - start]}
        if mask is not None:
            piece["attention_mask"] = mask[:, : mask.shape[1] - (end - b)]
        model(**fixed, **piece)
    a = pieces[-1][0]
    kwargs = {**fixed, key: seq[:, a - start :], "position_ids": positions[:, a - start :]}
    if mask is not None:
        kwargs["attention_mask"] = mask
    return kwargs


def _after_forward(model, args, kwargs, output: Any):
    cache = kwargs.get("past_key_values")
    if not _drives(cache) or not cache._routed:
        return None
    unroute(cache._routed.pop())
    if output is not None:  # None when the forward raised (always_call): leave the cache as it is
        cache.end_step()
    return None


__all__ = ["install_hooks"]
