"""The Golden Eviction oracle: block-averaged future attention and the greedy schedule (docs/oracle.md).

ForesightKV, "Learning to Evict: ForesightKV for Long-Context Reasoning" (Golden Eviction labels).

1. :func:`block_attention` runs the frozen model once over the whole trace with the full cache, through the
   same runtime as every other job (:func:`foresight.runtime.replay` with an observing policy), and
   accumulates, per layer and KV head, ā[i, j] = mean over the queries of block j and over the G query
   heads of the group of the softmax attention paid to key i. Blocks are the pieces of
   :func:`foresight.runtime.replay_schedule` (N, B, W), so oracle events coincide with replay events. Only
   the (N, n_blocks) block sums are kept per head (memory O(N · N/W)); the attention of one chunk of queries
   over the cache is formed transiently, never N × N for all heads.
2. :func:`greedy_schedule` walks the events: after block s, the candidates are the cache entries except the
   newest W, α_i = max over blocks j > s of ā[i, j] (0 when none remain), and the W candidates with the
   lowest α are evicted (ties: the older entry first). Vectorised over layers and KV heads.
3. :func:`event_foresight` keeps, per event, the column of suffix maxima that step 2 read α from, for *every*
   position appended so far: the oracle's value of any candidate any cache may hold at that event, which
   on-policy relabelling (:mod:`training.dagger`) needs. At most N/W columns of at most N values, packed:
   memory O(N · N/W) per head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

import torch

from foresight.models import model_fingerprint
from foresight.policies.base import EvictionPolicy
from foresight.runtime import replay, replay_schedule
from golden.labels import EventLabel, TraceLabels, token_hash

#: Default queries per forward step of the oracle's full-cache pass. The pass never evicts, so the chunk only
#: trades speed for transient memory (one chunk's (Hkv, G, chunk, N) probabilities per layer): on SmolLM2-135M
#: a 300-token trace labelled several times faster at 1,024 than at W=16 (one forward per W-block).
DEFAULT_CHUNK = 256

Pieces = Sequence[tuple[int, int, bool]]


def _attention(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The softmax attention a query pays an entry: docs/oracle.md's measure."""
    return probs


def _output_error(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How far evicting entry ``i`` alone moves query ``q``'s attention output: ``p/(1 − p) · ‖v_i − o_q‖``.

    After the renormalisation the output ``o = Σ_j p_j v_j`` becomes ``(o − p_i v_i) / (1 − p_i)``, so it moves
    by exactly that much (Goel et al., "CAOTE: KV Caching through Attention Output Error based Token Eviction",
    2025, https://arxiv.org/abs/2504.14051, which applies it to the newest query; here every future query). An
    entry a query attends to alone (``p = 1``, so ``v_i = o_q``) moves nothing.
    """
    n = probs.shape[-1]
    v = values[..., :n, :].float()[:, :, None].expand(*probs.shape[:3], n, -1)  # (b, Hkv, G, n, d)
    out = probs @ v  # (b, Hkv, G, q, d)
    dist = torch.cdist(out, v, compute_mode="donot_use_mm_for_euclid_dist")  # (b, Hkv, G, q, n), exact
    return probs / (1 - probs).clamp(min=1e-4) * dist


#: What a query's "attention" to an entry means to the oracle: name -> weight of (probs, values), the same shape
#: as ``probs``. ``attention`` is the method's; ``output`` weighs each entry by how far its eviction moves the output.
MEASURES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "attention": _attention,
    "output": _output_error,
}


def check_measure(measure: str) -> str:
    """``measure`` if it names one of :data:`MEASURES`, else a ValueError naming the choices."""
    if measure not in MEASURES:
        raise ValueError(f"unknown oracle measure {measure!r}: choose one of {', '.join(MEASURES)}")
    return measure


@dataclass
class BlockAttentionObserver(EvictionPolicy):
    """Observing, never-evicting policy that sums attention probabilities into (key, query block) cells.

    Not registered: it is the oracle's instrument, handed to :func:`foresight.runtime.replay` as an instance.

    Parameters
    ----------
    block_of
        (N,) block index of every position.
    num_blocks
        Number of blocks.
    measure
        What is summed, a name in :data:`MEASURES` (default the attention probabilities).
    """

    name: ClassVar[str] = "block_attention"
    observes: ClassVar[bool] = True
    evicts: ClassVar[bool] = False
    per_layer: ClassVar[bool] = True
    block_of: torch.Tensor = None
    num_blocks: int = 0
    measure: str = "attention"

    def __post_init__(self):
        self._weigh = MEASURES[check_measure(self.measure)]

    def reset(self, batch_size, num_layers, device, **meta):
        if batch_size != 1:
            raise ValueError("the block-attention observer labels one trace at a time")
        self.sums: list[torch.Tensor | None] = [None] * num_layers
        self._block_of = self.block_of.to(device)

    def observe(self, view):
        probs = self._weigh(view.probs, view.values)  # (1, Hkv, G, q, n) fp32: the new queries over the full cache
        n = probs.shape[-1]
        acc = self.sums[view.layer_idx]
        if acc is None:
            total = self._block_of.shape[0]
            acc = torch.zeros(probs.shape[1], total, self.num_blocks, device=probs.device, dtype=torch.float32)
            self.sums[view.layer_idx] = acc
        blocks = self._block_of[view.query_positions[0]]  # (q,)
        # (Hkv, q, n) summed over the group, then scattered into the query blocks: acc[h, i, blk[q]] += p[h, q, i]
        acc[:, :n].index_add_(2, blocks, probs[0].sum(1).transpose(1, 2))


def block_index(pieces: Pieces, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) block index of every position and (n_blocks,) block sizes for a replay schedule."""
    block_of = torch.empty(length, dtype=torch.long)
    sizes = torch.empty(len(pieces), dtype=torch.long)
    for j, (start, end, _) in enumerate(pieces):
        block_of[start:end] = j
        sizes[j] = end - start
    return block_of, sizes


def block_attention(model, input_ids, budget: int, interval: int, chunk: int | None = None,
                    measure: str = "attention"):
    """Block-averaged attention ā (L, Hkv, N, n_blocks) of one trace, and its blocks.

    Parameters
    ----------
    input_ids
        The trace, a list of ids or a (N,) / (1, N) tensor.
    budget, interval
        B and W; the blocks are the pieces of ``replay_schedule(N, B, W)``.
    chunk
        Queries per forward step of the full-cache pass (default :data:`DEFAULT_CHUNK`, at least W); only
        changes speed and transient memory.
    measure
        What is averaged (:data:`MEASURES`): the attention probabilities (default) or ``output``, each entry's
        attention-output error.

    Returns
    -------
    (abar, pieces)
        ``abar[l, h, i, j]`` is the mean attention of block ``j``'s queries (and the G query heads of KV head
        ``h``) to key ``i``, fp32 on the model's device; ``pieces`` the ``(start, end, fires)`` blocks.
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    n = ids.shape[1]
    pieces = replay_schedule(n, budget, interval)
    block_of, sizes = block_index(pieces, n)
    observer = BlockAttentionObserver(block_of=block_of, num_blocks=len(pieces), measure=measure)
    replay(model, ids, policy=observer, budget=None, interval=interval, chunk=chunk or max(interval, DEFAULT_CHUNK),
           logits=False)  # the attention is all it needs
    abar = torch.stack(observer.sums)  # (L, Hkv, N, nb)
    groups = model.config.num_attention_heads // (model.config.num_key_value_heads or model.config.num_attention_heads)
    abar /= (sizes.to(abar.device) * groups).float()
    return abar, pieces


def future_max_(abar: torch.Tensor) -> torch.Tensor:
    """In place: ``abar[..., j] ← max over j' ≥ j`` (suffix maximum along the block axis); returns ``abar``."""
    for j in range(abar.shape[-1] - 2, -1, -1):
        torch.maximum(abar[..., j], abar[..., j + 1], out=abar[..., j])
    return abar


def greedy_schedule(
    abar: torch.Tensor, pieces: Pieces, budget: int, interval: int, inplace: bool = False
) -> list[EventLabel]:
    """Golden eviction events from block-averaged attention, vectorised over layers and heads.

    Parameters
    ----------
    abar
        (L, Hkv, N, n_blocks) block-averaged attention (any leading dims work).
    pieces
        ``replay_schedule(N, B, W)``; an event follows every piece that fires.
    inplace
        Reuse ``abar``'s memory for the suffix maxima (it is overwritten).

    Returns
    -------
    list[EventLabel]
        One per event, tensors on CPU: candidates (ascending positions), their α, and the evicted positions.
    """
    future = future_max_(abar if inplace else abar.clone())
    lead = future.shape[:-2]
    nb = future.shape[-1]
    if nb != len(pieces):
        raise ValueError(f"abar has {nb} blocks but the schedule has {len(pieces)} pieces")
    device = future.device
    cache = torch.empty(*lead, 0, dtype=torch.long, device=device)
    events = []
    for s, (start, end, fire) in enumerate(pieces):
        new = torch.arange(start, end, device=device).expand(*lead, -1)
        cache = torch.cat([cache, new], dim=-1)
        if not fire:
            continue
        if cache.shape[-1] != budget + interval:
            raise ValueError(f"event at {end} with {cache.shape[-1]} entries, expected B+W={budget + interval}")
        cand, newest = cache[..., :budget], cache[..., budget:]
        if s + 1 < nb:
            alpha = future[..., s + 1].gather(-1, cand)
        else:
            alpha = torch.zeros(cand.shape, dtype=future.dtype, device=device)
        order = torch.sort(alpha, dim=-1, stable=True).indices  # ascending α, ties: older (lower index) first
        evicted = cand.gather(-1, order[..., :interval]).sort(dim=-1).values
        kept = cand.gather(-1, order[..., interval:].sort(dim=-1).values)
        cache = torch.cat([kept, newest], dim=-1)
        events.append(EventLabel(end, cand.cpu(), alpha.float().cpu(), evicted.cpu()))
    return events


def event_foresight(future: torch.Tensor, pieces: Pieces) -> torch.Tensor:
    """α(i, s) = max over blocks j > s of ā[..., i, j] for every position i < end at every event s (0 after the
    last block), from the suffix maxima ``future`` (``future_max_(abar)``), packed event after event along the
    last axis: (*lead, sum of event ends) fp32 on CPU (read it with :meth:`golden.labels.TraceLabels.alpha_at`)."""
    nb = future.shape[-1]
    cols = [future[..., :end, s + 1] if s + 1 < nb else torch.zeros_like(future[..., :end, 0])
            for s, (_, end, fire) in enumerate(pieces) if fire]
    if not cols:
        return torch.zeros(*future.shape[:-2], 0, dtype=torch.float32)
    return torch.cat(cols, dim=-1).float().cpu()


def label_trace(
    model, input_ids, budget: int, interval: int, trace_id: str = "", chunk: int | None = None,
    measure: str = "attention",
) -> TraceLabels:
    """Golden labels of one trace at budget B and interval W (events fire exactly where replay's do), with the
    foresight values of every position at every event (:func:`event_foresight`); ``measure`` as in
    :func:`block_attention`."""
    abar, pieces = block_attention(model, input_ids, budget, interval, chunk, measure)
    events = greedy_schedule(abar, pieces, budget, interval, inplace=True)  # abar now holds its suffix maxima
    return TraceLabels(trace_id, budget, interval, model_fingerprint(model), events, token_hash(input_ids),
                       foresight=event_foresight(abar, pieces), measure=measure)
