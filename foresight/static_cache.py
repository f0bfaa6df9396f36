"""The static-shape budgeted cache: decode steps of one fixed shape, compiled once (docs/runtime.md).

A :class:`StaticBudgetedCache` is a :class:`~foresight.cache.BudgetedCache` whose decode steps run through one
function of fixed shapes. The prompt is prefilled eagerly by the budgeted cache itself (chunked at the event
points, the policy observing as usual). Then the entries' buffers (:mod:`foresight.kv_storage`) are fitted to
exactly ``C = B + W`` slots per (layer, KV head) (``max_cache_len`` for a policy that never evicts) and every
decode step

* writes its keys, values, logical position and validity into slot ``n`` (a tensor: ``index_copy_``),
* attends over all ``C`` slots with the mask ``valid & slot <= n`` (the slots past ``n`` are stale),
* for a policy that observes decode steps all layers at once (``observes_layers``: every built-in policy that reads
  attention) records every layer's post-RoPE query into a fixed (L, batch, Hq, Q, d) buffer.

The slot number is the entry's index in the budgeted cache, so between two events the static buffers hold exactly
the entries the eager cache holds. When the cache holds ``B + W`` entries the eviction event runs eagerly, outside
the step: the recorded queries go to the policy as the held decode steps (:meth:`foresight.observer.Observer.hold`),
and the budgeted cache scores, gathers the kept ``B`` entries per KV head into slots ``[0, B)`` and lets the
policy follow; the write pointer goes back to ``B``. Logical positions (RoPE) are the tokens' own; they never
depend on the slot.

The step is compiled with ``torch.compile(fullgraph=True)`` (mode ``reduce-overhead`` on CUDA: CUDA graphs) once
per model, backend, mode and buffer shape; it does not recompile from one step to the next (the slot and query-row
numbers are tensors). ``compile=False`` runs the same step eagerly.

Supported policies: those that observe nothing (``full``, ``streaming_llm``, ``random``, ...) and those that take
decode steps all layers at once (``observes_layers``); :func:`static_reason` names why another policy (or a
padded batch with an observing policy) runs on the eager cache instead.

In ``model.generate`` the cache is a drop-in like the budgeted cache (``max_cache_len`` is needed for a policy
that never evicts)::

    cache = StaticBudgetedCache(model, policy="h2o", budget=128, interval=32)
    model.generate(input_ids, past_key_values=cache, max_new_tokens=256)

Building one installs, once per model, a wrapper of the model's ``forward`` that hands a static cache's decode
steps to the compiled step; any other forward (the prompt, a continuation of several tokens) runs eagerly through
the budgeted cache.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Callable

import torch
from transformers import AttentionInterface
from transformers.modeling_outputs import CausalLMOutputWithPast

from foresight.attention import attention_configs, restore_implementation, set_implementation
from foresight.cache import BudgetedCache
from foresight.errors import ForesightError
from foresight.forward_hooks import _step_inputs
from foresight.models import base_model_of
from foresight.observer import Observer
from foresight.policies import EvictionPolicy
from foresight.static_step import STATIC_ATTENTION, StaticConfig, compiled_step, static_attention

_WRAPPED = "_foresight_static_forward"
_ORIGINAL = "_foresight_static_original_forward"  # an instance-level forward the wrapper found, if any
_NOTED: set[str] = set()


def static_reason(policy: EvictionPolicy, budget: int | None, padded: bool = False) -> str | None:
    """Why ``policy`` cannot decode on the static cache (None: it can)."""
    if getattr(policy, "observes", False):
        if not getattr(policy, "observes_layers", False):
            return (f"policy {policy.name!r} observes every decode step layer by layer (observes_layers is not "
                    "set); the static cache records decode queries for policies that take them all layers at once")
        if budget is None or not policy.evicts:
            return f"policy {policy.name!r} observes but never evicts: its decode queries would pile up unbounded"
        if padded:
            return (f"policy {policy.name!r} observes decode steps and the batch is left-padded: its statistics "
                    "need the padding mask of every step")
    return None


def note_eager(reason: str) -> None:
    """Print once per process why generation runs on the eager budgeted cache."""
    if reason not in _NOTED:
        _NOTED.add(reason)
        print(f"[foresight] note: decoding on the eager cache (not compiled): {reason}", file=sys.stderr, flush=True)


def make_cache(model, policy: EvictionPolicy, budget, interval, sinks: int, protect_prompt: bool,
               static: bool | StaticConfig, max_cache_len: int, padded: bool) -> BudgetedCache:
    """The cache :func:`foresight.generate` decodes with: a :class:`StaticBudgetedCache` when ``static`` asks for
    one and the policy (and batch) allow it, else the eager :class:`~foresight.cache.BudgetedCache` (printing why)."""
    if static:
        cfg = static if isinstance(static, StaticConfig) else StaticConfig()
        reason = static_reason(policy, budget if policy.evicts else None, padded)
        if reason is None:
            return StaticBudgetedCache(model, policy, budget, interval, sinks, protect_prompt,
                                       max_cache_len=max_cache_len, static=cfg)
        note_eager(reason)
    return BudgetedCache(model, policy, budget, interval, sinks, protect_prompt)


# -- the cache --------------------------------------------------------------------------------------------------
class StaticBudgetedCache(BudgetedCache):
    """A :class:`~foresight.cache.BudgetedCache` whose decode steps have one fixed shape (module docstring).

    Parameters are those of :class:`~foresight.cache.BudgetedCache`, plus ``max_cache_len`` (slots of a cache
    whose policy never evicts: prompt plus new tokens) and ``static`` (:class:`StaticConfig`; ``compile`` True by
    default). A policy :func:`static_reason` refuses raises ``ValueError`` naming it.
    """

    selects_rows = False  # one compiled shape: the batch stays whole

    def __init__(self, model, policy="full", budget=None, interval=None, sinks=0, protect_prompt=False,
                 policy_kwargs=None, max_cache_len: int | None = None, static: StaticConfig | None = None, **meta):
        super().__init__(model, policy, budget, interval, sinks, protect_prompt, policy_kwargs, **meta)
        reason = static_reason(self.policy, self.budget)
        if reason:
            raise ValueError(f"StaticBudgetedCache: {reason}")
        if self.budget is None and (not isinstance(max_cache_len, int) or max_cache_len < 1):
            raise ValueError(f"StaticBudgetedCache: policy {self.policy.name!r} never evicts, so the cache needs "
                             f"max_cache_len (prompt + new tokens), got {max_cache_len!r}")
        self.max_cache_len = max_cache_len
        self.static_config = static or StaticConfig()
        model = base_model_of(model)
        self._model = model
        self._configs = attention_configs(model)
        self._scaling = getattr(model.get_decoder().layers[0].self_attn, "scaling", None)
        self._static = False
        self._n = 0  # entries held while static (the layers' views are brought up to date lazily)
        self._exposed = 0
        self._queries: torch.Tensor | None = None  # (L, b, Hq, Q, d) recorded decode queries
        self._held: list[torch.Tensor] = []  # their positions, (b, 1) each
        self._step_fn: Callable | None = None
        self.static_steps = 0  # decode steps that ran static (compiled or not)
        AttentionInterface.register(STATIC_ATTENTION, static_attention)
        install_static_forward(model)

    @property
    def drives_forward(self) -> bool:
        """The budgeted cache's forward hooks act on every forward but the static decode steps."""
        return not self._static

    @property
    def capacity(self) -> int:
        """Slots per (layer, KV head): ``B + W`` (plus the protected prompt), or ``max_cache_len``."""
        return self.target + self.interval if self.budget is not None else self.max_cache_len

    # -- entering and leaving the static steps --------------------------------------------------------------------
    def can_decode_static(self) -> bool:
        """True when the next decode step may run static: the prompt is in and nothing needs the eager steps."""
        return self.fed > 0 and self.span is None and static_reason(self.policy, self.budget, self._has_padding) is None

    def _enter_static(self) -> None:
        if self._static:
            return
        n, cap = self.length, self.capacity
        if n >= cap:
            raise ForesightError(f"StaticBudgetedCache: {n} entries fill its {cap} slots (max_cache_len="
                                 f"{self.max_cache_len}); build it with a larger max_cache_len")
        shared = self.shared
        if shared.capacity != cap:
            layers = shared.layers
            like = [layers[0].keys, layers[0].values, layers[0].positions, layers[0].valid]
            held = [layer.get_seq_length() for layer in layers]
            fitted = [t.new_zeros(len(layers), *t.shape[:2], cap, *t.shape[3:]) for t in like]
            for layer, m in zip(layers, held):
                for buf, cur in zip(fitted, (layer.keys, layer.values, layer.positions, layer.valid)):
                    buf[layer.layer_idx, :, :, :m] = cur
            shared.tensors = fitted
            for layer, m in zip(layers, held):
                layer._attach(m)
        else:  # slots past the entries may hold uninitialised memory: a NaN there would leak through a 0 weight
            for t in shared.tensors[:2]:
                t[:, :, :, n:].zero_()
        device = shared.tensors[0].device
        if self.policy.observes and self._queries is None:
            L, b = len(self.layers), shared.tensors[0].shape[1]
            hq = shared.tensors[0].shape[2] * self.num_groups
            rows = max(self.interval, cap - n)  # the most decode steps held between two hand-overs
            self._queries = shared.tensors[0].new_zeros(L, b, hq, rows, shared.tensors[0].shape[-1])
        if device.type == "cuda" and not torch.compiler.is_compiling():
            for t in (*shared.tensors, *([] if self._queries is None else [self._queries])):
                torch._dynamo.mark_static_address(t)
        shapes = (*(tuple(t.shape) for t in shared.tensors), shared.tensors[0].dtype,
                  None if self._queries is None else tuple(self._queries.shape))
        self._step_fn = compiled_step(self._model, self.static_config, device, shapes)
        self._n = self._exposed = n
        self._static = True

    def _expose(self) -> None:
        """Bring the layers' views up to the entries held, and hand the recorded queries to the observer."""
        if self._exposed != self._n:
            for layer in self.layers:
                layer._expose(self._n)
            self._exposed = self._n
        if self._held:
            k = len(self._held)
            self.observer.hold(self._queries[:, :, :, :k], torch.cat(self._held, dim=1), self._scaling)
            self._held = []

    def leave_static(self) -> None:
        """Continue on the eager budgeted cache (its next forward re-enters the static steps when it can)."""
        if self._static:
            self._expose()
            self._static = False

    def flush_observations(self) -> None:
        self._expose()
        super().flush_observations()

    def stats(self) -> dict:
        self._expose()
        return super().stats()

    @property
    def length(self) -> int:
        return self._n if self._static else super().length

    # -- one static decode step -----------------------------------------------------------------------------------
    def decode(self, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """One decode step of tokens ``ids`` (b, 1) at logical ``positions`` (b, 1): logits (b, vocab); the event
        runs after it when due."""
        n, cap = self._n, self.capacity
        if n >= cap:
            raise ForesightError(f"StaticBudgetedCache: all {cap} slots are used (max_cache_len={self.max_cache_len});"
                                 " build it with a larger max_cache_len")
        device = ids.device
        # fresh (b, 1) tensors: views of a growing attention mask change strides from step to step (a recompile)
        ids, positions, valid = (t.reshape(-1, 1).clone(memory_format=torch.contiguous_format)
                                 for t in (ids, positions, valid))
        slot = torch.full((1,), n, dtype=torch.long, device=device)
        qslot = torch.full((1,), len(self._held), dtype=torch.long, device=device) if self._queries is not None \
            else None
        saved = set_implementation(self._configs, STATIC_ATTENTION)
        cudagraphs = self._step_fn is not None and device.type == "cuda" and \
            self.static_config.resolved_mode(device) == "reduce-overhead" and self.static_config.compile
        try:
            if cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            t = self.shared.tensors
            logits = self._step_fn(ids, positions, valid, slot, qslot, t[0], t[1], t[2], t[3], self._queries)
        finally:
            restore_implementation(saved)
        if cudagraphs:
            logits = logits.clone()  # the graph's output buffer is overwritten by the next replay
        self._n = n + 1
        self.fed += 1
        self.step += 1
        self.static_steps += 1
        for i in range(len(self.peak_entries)):
            self.peak_entries[i] = max(self.peak_entries[i], n + 1)
        if self._queries is not None:
            self._held.append(positions)
        due = self._due(n + 1)
        if due or self._over_cap(n + 1):
            self._expose()
            super().flush_observations()
        if due:
            self._evict(self.target, min(self.interval, n))
            self._n = self._exposed = self.layers[0].get_seq_length()
        return logits

    def _over_cap(self, n: int) -> bool:
        """The eager observer's hand-over rule (:meth:`Observer.over_cap`), or the query buffer full."""
        if self._queries is None or not self._held:
            return False
        k = len(self._held)
        per_step = self._queries[:, :, :, 0, 0].numel()
        return 4 * k * per_step * n >= Observer.observe_bytes or k == self._queries.shape[3]


# -- the model's forward ------------------------------------------------------------------------------------------
def _plain_decode(args, kwargs) -> bool:
    """Whether a forward is one decode step the static step can take: one new token per row, nothing else asked."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    return (isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[1] == 1 and not args[1:]
            and kwargs.get("inputs_embeds") is None and not kwargs.get("output_attentions")
            and not kwargs.get("output_hidden_states") and kwargs.get("labels") is None)


def _choose_path(module, args, kwargs):
    """Forward pre-hook, before the budgeted cache's: a static cache enters the static steps for a plain decode
    step it can take and leaves them for any other forward (which its hooks then drive eagerly)."""
    cache = kwargs.get("past_key_values")
    if isinstance(cache, StaticBudgetedCache):
        if _plain_decode(args, kwargs) and cache.can_decode_static():
            cache._enter_static()
        else:
            cache.leave_static()
    return None


def install_static_forward(model) -> None:
    """Once per model: a pre-hook (:func:`_choose_path`) and a wrapper of ``model.forward`` that hands a static
    cache's decode steps to :meth:`StaticBudgetedCache.decode`."""
    if model.__dict__.get(_WRAPPED):
        return
    if "forward" in model.__dict__:  # another wrapper's, kept (a bound method is re-bound by copy.deepcopy)
        model.__dict__[_ORIGINAL] = model.__dict__["forward"]

    @functools.wraps(type(model).forward)  # generate reads the signature
    def forward(self, *args, **kwargs):
        cache = kwargs.get("past_key_values")
        if not isinstance(cache, StaticBudgetedCache) or not cache._static:
            original = self.__dict__.get(_ORIGINAL) or type(self).forward.__get__(self)
            return original(*args, **kwargs)
        ids = kwargs.pop("input_ids", args[0] if args else None)
        positions, valid = _step_inputs(cache, ids, kwargs)
        logits = cache.decode(ids, positions, valid)
        return CausalLMOutputWithPast(logits=logits[:, None, :], past_key_values=cache)

    model.register_forward_pre_hook(_choose_path, with_kwargs=True, prepend=True)
    # bound to the model, not closing over it: copy.deepcopy re-binds a bound method to the copy
    model.forward = types.MethodType(forward, model)
    model.__dict__[_WRAPPED] = True


__all__ = ["StaticBudgetedCache", "install_static_forward", "make_cache", "note_eager", "static_reason"]
