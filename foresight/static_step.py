"""The fixed-shape decode step of :class:`foresight.static_cache.StaticBudgetedCache`, and how it is compiled.

One step of ``C`` slots per (layer, KV head): the new token's keys, values, logical position and validity go into
slot ``n`` (a tensor), attention runs over all ``C`` slots masked to the live ones, and the decode queries are
recorded into a fixed buffer for policies that observe them. :func:`compiled_step` compiles it once per model,
backend, mode and buffer shapes (docs/runtime.md, "The static cache").
"""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

STATIC_ATTENTION = "foresight_static"
# per model: {(backend, mode, fullgraph, buffer shapes): compiled step}; not in the model's __dict__, where a
# copy.deepcopy of the model would inherit steps that run the original's weights
_STEPS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class StaticConfig:
    """How the static decode step runs.

    ``compile``: ``torch.compile`` the step (False: the same fixed-shape step, eagerly). ``backend``: dynamo's
    backend (a name or a callable, e.g. ``torch._dynamo.testing.CompileCounter``). ``mode``: torch.compile's mode;
    None: ``reduce-overhead`` (CUDA graphs) on CUDA and the default elsewhere. ``fullgraph``: refuse graph breaks.
    """

    compile: bool = True
    backend: Any = "inductor"
    mode: str | None = None
    fullgraph: bool = True

    def __post_init__(self):
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be true or false, got {self.compile!r}")
        if not (isinstance(self.backend, str) and self.backend) and not callable(self.backend):
            raise ValueError(f"backend must be a torch.compile backend name or callable, got {self.backend!r}")
        if self.mode not in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
            raise ValueError(f"mode must be a torch.compile mode, got {self.mode!r}")

    def resolved_mode(self, device: torch.device) -> str | None:
        if self.mode is not None:
            return self.mode
        return "reduce-overhead" if device.type == "cuda" and self.backend == "inductor" else None



def static_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA over a layer's ``C`` static slots, masked to the live ones; records the query when asked."""
    live, queries, qslot = kwargs.pop("foresight_static")
    layer = module.layer_idx
    if queries is not None:
        queries[layer].index_copy_(2, qslot, query)
    mask = live[layer][:, :, None, :]  # (b, Hkv, 1, C)
    g = query.shape[1] // key.shape[1]
    if g > 1:
        mask = mask.repeat_interleave(g, dim=1)
    kwargs["is_causal"] = False
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


class _SlotWriter:
    """The ``past_key_values`` of a static step: every layer writes its new keys and values into slot ``slot``."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slot: torch.Tensor):
        self.keys, self.values, self.slot = keys, values, slot

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.slot, key_states)
        values.index_copy_(2, self.slot, value_states)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:  # only read when position_ids are missing
        raise RuntimeError("a static step needs explicit position_ids")


def make_step(model) -> Callable:
    """The static decode step of ``model`` (uncompiled): (ids, positions, valid, slot, qslot, keys, values,
    entry positions, entry validity, query buffer or None) -> logits (b, vocab)."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    kinds = {"full_attention": None, "sliding_attention": None}

    def step(ids, pos, valid, slot, qslot, keys, values, positions, valid_buf, queries):
        L, b, hkv, c = positions.shape
        positions.index_copy_(3, slot, pos.view(1, b, 1, 1).expand(L, b, hkv, 1).to(positions.dtype))
        valid_buf.index_copy_(3, slot, valid.view(1, b, 1, 1).expand(L, b, hkv, 1))
        slots = torch.arange(c, device=slot.device)
        live = (valid_buf | (slots == slot)) & (slots <= slot)  # the step's own entry is always seen
        out = decoder(input_ids=ids, position_ids=pos, past_key_values=_SlotWriter(keys, values, slot),
                      attention_mask=kinds, use_cache=True, foresight_static=(live, queries, qslot))
        return head(out.last_hidden_state[:, -1])

    return step


def compiled_step(model, cfg: StaticConfig, device: torch.device, shapes: tuple) -> Callable:
    """``model``'s static step for buffers of ``shapes``, compiled once per (backend, mode, fullgraph, shapes) and
    kept on the model. Each is its own code object, so dynamo's per-code recompile limit never counts the shapes of
    other caches, and each compiles exactly once (``dynamic=False``: every shape is static)."""
    if not cfg.compile:
        return make_step(model)
    steps = _STEPS.setdefault(model, {})
    mode = cfg.resolved_mode(device)
    key = (cfg.backend, mode, cfg.fullgraph, shapes)
    if key not in steps:
        step = make_step(model)
        fresh = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__, step.__defaults__,
                                   step.__closure__)
        steps[key] = torch.compile(fresh, backend=cfg.backend, mode=mode, fullgraph=cfg.fullgraph, dynamic=False)
    return steps[key]


__all__ = ["STATIC_ATTENTION", "StaticConfig", "compiled_step", "make_step", "static_attention"]
