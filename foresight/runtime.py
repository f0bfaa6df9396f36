"""The one decoding engine: a forward through a :class:`~foresight.cache.BudgetedCache` and chunked
teacher-forced replay (docs/runtime.md).

The cache owns the eviction rule (when and what to evict, see :mod:`foresight.schedule`); the engine only feeds
tokens. :func:`forward_logits` is the one forward both callers use:

* :func:`replay` (here) feeds a fixed sequence in the pieces of :func:`~foresight.schedule.replay_schedule` (at
  most ``W`` tokens, never straddling an event; :data:`FULL_PIECE` tokens for a policy that neither evicts nor
  observes) and records per-token cross-entropy and entropy. With ``chunk=1`` it is token-by-token decoding. A
  per-layer policy's pieces are fed layer-major, up to :data:`FULL_PIECE` tokens of them in one forward
  (:mod:`foresight.layer_major`: the same result at nearly the cost of one forward);
* :func:`foresight.generation.generate` prefills a prompt in one call (the cache cuts it at the event points)
  and decodes token by token; generation and replay of the same tokens evict at the same points.
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from foresight.cache import BudgetedCache
from foresight.errors import ForesightError
from foresight.layer_major import ENGINES, layer_major_reason, note_piecewise, spans
from foresight.limits import check_replay
from foresight.models import SUPPORTED_MODEL_TYPES, UnsupportedModelError, check_supported, model_shape
from foresight.policies import EvictionPolicy, make_policy
from foresight.schedule import CacheConfig, replay_schedule


def resolve_policy(policy: str | EvictionPolicy, **policy_kwargs) -> EvictionPolicy:
    if isinstance(policy, str):
        return make_policy(policy, **policy_kwargs)
    if policy_kwargs:  # an instance already holds its hyperparameters: these would be ignored
        raise ValueError("policy_kwargs only apply to a policy given by name")
    return policy


def check_token_ids(model, ids: torch.Tensor) -> None:
    """Refuse token ids the model's embedding cannot look up (sequences of another tokenizer or model): an
    IndexError on the CPU, a device-side assert that ends the process on CUDA."""
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ForesightError(f"token ids must be integers, got a {str(ids.dtype).removeprefix('torch.')} tensor")
    vocab = model.get_input_embeddings().num_embeddings
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ForesightError(f"token id {bad} is outside the model's vocabulary (0 .. {vocab - 1}); the tokens were "
                             "made with another tokenizer or model")


def forward_logits(model, cache: BudgetedCache, input_ids, positions, attention_mask=None,
                   logits_to_keep: int = 0):
    """Logits of one forward of ``input_ids`` at ``positions`` through ``cache`` (which evicts when due)."""
    out = model(
        input_ids=input_ids,
        position_ids=positions,
        attention_mask=attention_mask,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits


# ----------------------------------------------------------------------------------------------------------------
# Chunked teacher-forced replay
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """Per-token cross-entropy and next-token entropy from :func:`replay`.

    ``ce[b, i]`` is ``-log p(x[i+1] | x[:i+1])`` under the evicted cache (NaN past a row's length);
    ``entropy[b, i]`` the entropy of that next-token distribution. Both (batch, N-1), fp32, on CPU. ``engine``:
    how the pieces were fed (``layer-major`` or ``piecewise``).
    """

    ce: torch.Tensor
    entropy: torch.Tensor
    lengths: list[int]
    stats: dict = field(default_factory=dict)
    engine: str = "piecewise"


LogitsHook = Callable[[int, int, torch.Tensor], None]

#: Default piece of a replay whose policy neither evicts nor observes (``full``): nothing happens between pieces,
#: so they only bound the memory of one piece's logits (batch x piece x vocabulary), and pieces of ``W`` tokens
#: would re-read every weight once per ``W`` tokens (a 2.8x slower full-cache reference on SmolLM2 at W=16 on
#: this CPU, ``benchmarks/bench_replay.py``). The logits agree with ``W``-token pieces to float rounding.
FULL_PIECE = 512


def _autograd(grad: bool):
    """Inference mode, or (``grad``) autograd on even under a caller's ``no_grad`` / ``inference_mode``."""
    if not grad:
        return torch.inference_mode()
    stack = ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad())
    return stack


def replay(
    model,
    sequences: torch.Tensor | Sequence[Sequence[int]],
    policy: str | EvictionPolicy = "full",
    budget: int | None = None,
    interval: int | None = None,
    sinks: int = 0,
    chunk: int | None = None,
    on_logits: LogitsHook | None = None,
    progress: bool = False,
    policy_kwargs: dict | None = None,
    pad_token_id: int = 0,
    grad: bool = False,
    truncate_backprop: bool = False,
    grad_from: int = 0,
    engine: str = "auto",
    logits: bool = True,
    **meta,
) -> ReplayResult:
    """Teacher-forced replay of fixed token sequences under an eviction policy.

    Feeds the sequences in pieces of at most ``chunk`` (default ``W``; :data:`FULL_PIECE` when the policy neither
    evicts nor observes) tokens; each piece attends to the evicted cache plus itself causally, and the cache is
    evicted after every piece that reaches an event (see :func:`replay_schedule`). With ``chunk=1`` this is
    token-by-token decoding, and the results agree.

    Parameters
    ----------
    sequences
        (batch, N) token ids or a list of id lists (right-padded internally; padding only follows real tokens,
        so it never influences them).
    on_logits
        Optional hook ``f(start, end, logits)`` called with each piece's fp32 (fp64 for an fp64 model) logits
        (batch, end-start, V), for metrics that need whole distributions (KL, top-1 agreement).
    grad
        Record gradients (default: inference mode): ``on_logits`` then receives logits with their graph, through
        the same schedule, cache and policy (eviction decisions stay without gradient; the cache keeps its entries
        out of place, see :class:`~foresight.cache.BudgetedLayer`). Used to train a model under its own eviction
        (``foresight train adapt``). ``ce``/``entropy`` are detached.
    truncate_backprop
        With ``grad``: detach the cached keys/values after every piece, so gradients flow within a piece only.
    grad_from
        With ``grad``: the pieces that end at or before token ``grad_from`` run without gradient (fed as spans of
        their own). Exact for parameters that act on the replay only after that token, as a scorer's eviction
        biases act after the first event (``foresight train e2e`` passes B + W): the gradient never needs the
        activations of the tokens before it.
    engine
        ``auto`` (default): layer-major (:mod:`foresight.layer_major`) for a policy that declares ``per_layer``,
        else piecewise with the reason printed once; ``layer-major`` or ``piecewise`` to choose (the same results
        up to float rounding; ``layer-major`` refuses a policy that is not per-layer).
    logits
        ``False``: each forward computes its last position's logits only (``logits_to_keep=1``) and the result's
        ``ce``/``entropy`` stay NaN, for callers that need only the evictions or what the policy observes (golden
        labelling, feature extraction, DAgger recording): the LM head and the log-softmax over the vocabulary are
        a fifth of a SmolLM2 replay's time. Not with ``on_logits`` or ``grad``.
    meta
        Passed to ``policy.reset`` (e.g. ``trace_ids`` for the golden policy).
    """
    if not logits and (on_logits is not None or grad):
        raise ValueError("replay(logits=False) computes no logits to hand to on_logits or to differentiate")
    if grad_from and not grad:
        raise ValueError(f"replay(grad_from={grad_from}) without grad=True: there is no gradient to start later")
    policy = resolve_policy(policy, **(policy_kwargs or {}))
    layer_major = _layer_major(policy, engine)
    device = model.device
    kept = budget if budget is not None and policy.evicts else None  # at least B + W entries
    if isinstance(sequences, torch.Tensor):
        ids = sequences.to(device)
        if ids.dim() == 1:
            ids = ids[None]
        lengths = [ids.shape[1]] * ids.shape[0]
        check_replay(model, len(lengths), max(lengths), kept, chunk or interval or 1)
    else:
        lengths = [len(s) for s in sequences]
        width = max(lengths)
        check_replay(model, len(lengths), width, kept, chunk or interval or 1)  # before the batch is built
        ids = torch.tensor([list(s) + [pad_token_id] * (width - len(s)) for s in sequences], device=device)
    check_token_ids(model, ids)
    batch, n = ids.shape
    # the rows' real tokens reach the policy too: the golden policy checks them against its labels' token hashes
    cache = BudgetedCache(model, policy, budget, interval, sinks,
                          token_ids=[ids[b, : lengths[b]] for b in range(batch)], **meta)
    ce = torch.full((batch, max(n - 1, 0)), float("nan"))
    ent = torch.full_like(ce, float("nan"))
    if chunk is None and not policy.evicts and not policy.observes:
        chunk = FULL_PIECE
    pieces = cache.pieces(n, chunk)
    head = [p for p in pieces if p[1] <= grad_from]  # fed without gradient (grad_from)
    rest = pieces[len(head):]
    groups = spans(head, FULL_PIECE) + spans(rest, FULL_PIECE) if layer_major else [[p] for p in pieces]
    layer_major = layer_major and any(len(g) > 1 for g in groups)
    positions_all = torch.arange(n, device=device)[None].expand(batch, -1)
    with _autograd(grad):
        for group in tqdm(groups, desc=f"replay[{policy.name}]", disable=not progress, leave=False):
            start, end = group[0][0], group[-1][1]
            if len(group) > 1:
                cache.feed_span(group, detach=truncate_backprop)
            try:
                with torch.no_grad() if end <= grad_from else nullcontext():
                    out = forward_logits(model, cache, ids[:, start:end], positions_all[:, start:end],
                                         logits_to_keep=0 if logits else 1)
            finally:
                cache.span = None
            if not logits:  # no grad, no hook (checked above): only the evictions and observations were wanted
                continue
            out = out if out.dtype == torch.float64 else out.float()  # fp32, fp64 models keep fp64
            if on_logits is not None:  # split, not sliced: a slice's backward fills a zero tensor of all the logits
                pieces_out = out.split([b - a for a, b, _ in group], dim=1)
                for (a, b, _), piece_out in zip(group, pieces_out):
                    on_logits(a, b, piece_out)
            if truncate_backprop:
                cache.detach_()
            _record_ce(ce, ent, ids, out.detach(), start, min(end, n - 1))
    for b, length in enumerate(lengths):
        ce[b, max(length - 1, 0) :] = float("nan")
        ent[b, max(length - 1, 0) :] = float("nan")
    cache.flush_observations()  # the policy's state covers every step (decode steps wait for the next event)
    stats = {**cache.stats(), "policy": policy.name}
    return ReplayResult(ce, ent, lengths, stats, "layer-major" if layer_major else "piecewise")


def _layer_major(policy: EvictionPolicy, engine: str) -> bool:
    """Whether :func:`replay` feeds ``policy``'s pieces layer-major (``engine`` in :data:`ENGINES`)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "piecewise" or (not policy.evicts and not policy.observes):  # full: one piece per forward anyway
        return False
    reason = layer_major_reason(policy)
    if reason is not None:
        if engine == "layer-major":
            raise ValueError(f"engine='layer-major': {reason}")
        note_piecewise(reason)
    return reason is None


def _record_ce(ce: torch.Tensor, ent: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, start: int,
               stop: int) -> None:
    """Write the CE and entropy of positions ``start .. stop-1`` of one piece's logits into ``ce`` / ``ent``."""
    if stop <= start:
        return
    lp = torch.log_softmax(logits[:, : stop - start], dim=-1)
    target = ids[:, start + 1 : stop + 1]
    ce[:, start:stop] = -lp.gather(-1, target[..., None]).squeeze(-1).cpu()
    ent[:, start:stop] = -(lp.exp() * lp).sum(-1).cpu()


def length_batches(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices ``0 .. len(lengths) - 1`` in the fewest batches of at most ``size``, longest first (equal lengths in
    their given order). A batched :func:`replay` runs every row for its batch's longest sequence, padding the others,
    so the batches are runs of the length order, the one short batch placed where it pads least: the least padding of
    any batching into as many batches (24 of the recipe's training traces in batches of 4: 1.09 times their tokens,
    against 1.38 times in trace order; ``benchmarks/bench_batching.py``)."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n, short = len(order), len(order) % size
    if not short:
        return [order[i : i + size] for i in range(0, n, size)]
    longest = [lengths[i] for i in order]  # a run's padded size is its first length times its rows
    head = [0]  # head[k]: the first k full batches
    for k in range(n // size):
        head.append(head[-1] + longest[k * size] * size)
    tail, best = 0, None  # tail: the full batches after the short one
    for k in range(n // size, -1, -1):  # the short batch after k full ones
        cost = head[k] + longest[k * size] * short + tail
        if best is None or cost <= best[0]:
            best = (cost, k * size)
        if k:
            tail += longest[(k - 1) * size + short] * size
    j = best[1]
    return ([order[i : i + size] for i in range(0, j, size)] + [order[j : j + short]]
            + [order[i : i + size] for i in range(j + short, n, size)])


def full_forward_ce(model, ids: torch.Tensor) -> torch.Tensor:
    """Reference: per-token CE of one plain full-attention forward pass, (batch, N-1) on CPU."""
    with torch.inference_mode():
        logits = model(input_ids=ids.to(model.device)).logits.float()
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:].to(model.device), reduction="none").cpu()


__all__ = [  # CacheConfig, replay_schedule and the model checks are re-exported for callers of the engine
    "CacheConfig",
    "FULL_PIECE",
    "ReplayResult",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "check_supported",
    "check_token_ids",
    "forward_logits",
    "full_forward_ce",
    "length_batches",
    "model_shape",
    "replay",
    "replay_schedule",
    "resolve_policy",
]
