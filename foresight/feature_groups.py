"""The feature groups of the learned scorer (docs/training.md): what each candidate's feature vector holds.

Each group builds, at an eviction event, (batch, Hkv, C, width) fp32 features of the C candidates of one layer
from the :class:`~foresight.views.EvictView`, the layer's observed statistics (:class:`LayerState`) and the
extractor that keeps them (:class:`foresight.features.FeatureExtractor`: its ``window`` and ``num_groups``).
Groups are computed independently of each other, so the features of a subset equal the matching columns of a
superset's (:func:`feature_columns`).

``key``
    the cached key (post-RoPE, post k-norm: exactly what the cache stores), ``d`` numbers.
``value``
    the cached value, ``d`` numbers.
``prekey``
    the cached key with its rotary embedding undone (:meth:`~foresight.views.EvictView.prerope_keys`): what the
    key projection (and k-norm) produced, the same numbers wherever the token stands, so a scorer does not learn
    the absolute positions of its training traces (a post-RoPE key rotates with the position, and traces longer
    than the training ones put candidates at angles it never saw). ``d`` numbers; needs a cache built from a
    model with static RoPE frequencies.
``attn``
    per query head of the group, 8 numbers: max and min over the last ``W`` queries; sums over the last
    ``W``, 32, 16 and 8 queries; cumulative attention of every query since the entry arrived (up to this
    event); the same with each earlier inter-event segment decayed by ``decay`` per event.
    ``8 * G`` numbers, each mapped through ``log(x + 1e-6)`` (attention spans orders of magnitude).
``age``
    ``log1p(t - position)``, with ``t`` the newest position in the cache plus one; 1 number.
``neighbors``
    the candidate's two cache neighbours (the entries just before and after it in the cache as it stands, so what
    earlier evictions left): ``log1p`` of the number of evicted positions between it and each (before the first
    entry: its position), the cosine of its pre-RoPE key with each neighbour's, and ``log`` of each neighbour's
    attention over the last ``W`` queries (mean over the query heads of the group). A missing neighbour (padding)
    gives 0, 0 and ``log(1e-6)``. 6 numbers; needs what ``prekey`` needs. Top-k over per-entry scores evicts
    near-tied runs of adjacent tokens as a block; these let a scorer see
    whether an entry is the last survivor of its span.
``query``
    per query head of the group, 2 numbers: the mean and the max over the last ``W`` queries of the logit
    ``q · k / sqrt(d)`` between the query and the candidate's key, both with their rotary embedding undone, so
    the affinity of content without RoPE's distance decay (NVIDIA kvpress's ``ExpectedAttentionPress``,
    https://github.com/NVIDIA/kvpress, estimates future attention from the statistics of recent queries likewise):
    an old entry that recent queries would attend to but for its distance. ``2 * G`` numbers; needs what ``prekey``
    needs. Padded query rows (no visible entry) count for nothing.
``recency``
    per query head of the group, 2 numbers: ``log1p(t - last)`` and ``log1p(mri)``, LazyEviction's recurrence
    state (:mod:`foresight.recurrence`) with a query *activating* an entry when it pays it more than the uniform
    share of its attention (``a * n_visible >= 1``); ``last`` starts at the entry's own position and ``mri`` at
    0, and every query since the entry arrived counts, the prompt's included. ``2 * G`` numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from foresight.views import EvictView, unrotate_keys

#: Short attention windows (in queries) summed besides the last ``W``; the ring buffer keeps the longest.
SHORT_WINDOWS = (32, 16, 8)
ATTN_STATS = 8  # max, min, sum_W, sum_32, sum_16, sum_8, cumulative, decayed
LOG_EPS = 1e-6


@dataclass
class LayerState:
    """One layer's attention statistics, views of the extractor's stacked storage so that a step copies nothing.

    ``rows[..., r, i]`` holds the attention that query number ``t`` with ``t % R == r`` paid to entry ``i`` (a
    ring over the last ``R`` queries; ``head`` counts queries seen); ``run[..., i]`` the attention of all queries
    since the last event. Columns ``>= n`` (entries not in the cache) are kept at zero, so an appended entry
    starts with no attention from earlier queries; the capacity grows by doubling, for every layer at once.
    """

    rows: torch.Tensor | None = None  # (b, Hkv, G, R, capacity)
    run: torch.Tensor | None = None  # (b, Hkv, G, capacity)
    n: int = 0  # entries tracked (columns in use)
    head: int = 0  # queries observed so far
    filled: int = 0  # valid rows in the ring, min(head, R)
    cum: torch.Tensor | None = None  # (b, Hkv, G, n_event) attention of all queries up to the last event
    dec: torch.Tensor | None = None  # (b, Hkv, G, n_event) the same, each segment decayed per later event
    seen: torch.Tensor | None = None  # (b, Hkv, G, capacity) position of the last activating query (recency)
    queries: torch.Tensor | None = None  # (b, Hq, R, d) post-RoPE queries of the last R queries, a ring like rows
    query_pos: torch.Tensor | None = None  # (b, R) their positions
    query_ok: torch.Tensor | None = None  # (b, R) whether each row is a real query (not padding)
    mri: torch.Tensor | None = None  # (b, Hkv, G, capacity) maximum recurrence interval (recency)
    slots: dict[int, torch.Tensor] | None = None  # last_slots(k) per count k, set at each event (ring_state)
    windows: torch.Tensor | None = None  # window_weights(...) of the attn group, likewise

    def last(self, k: int, c: int) -> torch.Tensor:
        """Attention rows of the last ``min(k, filled)`` queries over the first ``c`` entries, oldest first."""
        return self.rows[..., :c].index_select(3, self.last_slots(k))

    def last_slots(self, k: int) -> torch.Tensor:
        """Ring slots of the last ``min(k, filled)`` queries, oldest first (``slots``' when set)."""
        k = min(k, self.filled)
        if self.slots is not None:
            return self.slots[k]
        return ring_slots(self.head, k, self.rows.shape[3], self.rows.device)


def ring_slots(head: int, k: int, size: int, device) -> torch.Tensor:
    """Slots of a ring of ``size`` rows holding the last ``k`` of ``head`` rows written, oldest first."""
    return torch.arange(head - k, head, device=device) % size


def window_weights(head: int, filled: int, window: int, size: int, device) -> torch.Tensor:
    """The attn group's window sums as weights over a ring of ``size`` rows after ``head`` rows written, ``filled`` of
    them kept: (4, size) fp32, row ``j`` one at the slots of the last ``min(k_j, filled)`` rows for ``k`` in
    ``(window, *SHORT_WINDOWS)`` and zero elsewhere. One matrix product with the ring sums every window, reading the
    ring in its own order, contiguous over the entries, where gathering each window's rows would not."""
    weights = torch.zeros(1 + len(SHORT_WINDOWS), size, device=device)
    for j, k in enumerate((window, *SHORT_WINDOWS)):
        weights[j, ring_slots(head, min(k, filled), size, device)] = 1.0
    return weights


def _group_key(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    return view.keys[..., :c, :].float()


def _group_value(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    return view.values[..., :c, :].float()


def _group_prekey(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    return view.prerope_keys(c)


def _group_attn(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    b, h, n = view.positions.shape
    g = ext.num_groups
    if st.rows is None or st.filled == 0:
        stats = torch.zeros(b, h, g, ATTN_STATS, c, device=view.keys.device)
    else:
        rows = st.rows[..., :c]  # (b, h, g, R, c), the ring in slot order
        weights = st.windows if st.windows is not None else window_weights(st.head, st.filled, ext.window,
                                                                            rows.shape[3], rows.device)
        sums = torch.matmul(weights, rows)  # (b, h, g, 4, c): over the last W, 32, 16 and 8 queries
        low, high = torch.aminmax(st.last(ext.window, c), dim=3, keepdim=True)
        stats = torch.cat([high, low, sums, st.cum[..., None, :c], st.dec[..., None, :c]], dim=3)  # (b, h, g, 8, c)
    stats = torch.log(stats + LOG_EPS)
    return stats.reshape(b, h, g * ATTN_STATS, c).transpose(-1, -2)


def cache_now(positions: torch.Tensor) -> torch.Tensor:
    """``t``, the newest position in the cache plus one, per row (float, the last dimension kept as 1)."""
    return positions.float().amax(-1, keepdim=True) + 1


def entry_age(positions: torch.Tensor, c: int) -> torch.Tensor:
    """``t - position`` of the first ``c`` entries (float), ``t`` :func:`cache_now`."""
    return (cache_now(positions) - positions[..., :c].float()).clamp(min=0)


def log_age(positions: torch.Tensor, c: int) -> torch.Tensor:
    """``log1p`` of :func:`entry_age`: the ``age`` feature; the ``learned`` policy's ``age_prior`` subtracts a multiple
    of it."""
    return torch.log1p(entry_age(positions, c))


def _group_age(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    return log_age(view.positions, c)[..., None]


def _group_neighbors(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    b, h, _ = view.positions.shape
    m = c + 1  # the candidates and the first protected entry (n = c + W > c)
    pos, valid = view.positions[..., :m].float(), view.valid[..., :m]
    keys = torch.nn.functional.normalize(view.prerope_keys(m), dim=-1)
    if st.rows is None or st.filled == 0:
        attn = torch.zeros(b, h, m, device=pos.device)
    else:
        attn = st.last(ext.window, m).sum(3).mean(2)  # (b, h, m): each entry's last-W attention, mean over G
    attn = torch.log(attn + LOG_EPS)
    cand = valid[..., :c]
    left = torch.zeros_like(cand)
    left[..., 1:] = valid[..., : c - 1] & cand[..., 1:]
    right = valid[..., 1:m] & cand
    prev = torch.cat([torch.full_like(pos[..., :1], -1.0), pos[..., : c - 1]], dim=-1)
    # before the first entry every position since 0 is gone: its gap is its own position
    gap_left = torch.where(left, pos[..., :c] - prev - 1, pos[..., :c]).clamp(min=0) * cand
    gap_right = torch.where(right, pos[..., 1:m] - pos[..., :c] - 1, torch.zeros_like(gap_left)).clamp(min=0)
    cos_right = (keys[..., :c, :] * keys[..., 1:m, :]).sum(-1)
    cos_left = torch.cat([torch.zeros_like(cos_right[..., :1]), cos_right[..., : c - 1]], dim=-1)
    floor = math.log(LOG_EPS)
    attn_left = torch.cat([torch.full_like(attn[..., :1], floor), attn[..., : c - 1]], dim=-1)
    stats = torch.stack([
        torch.log1p(gap_left), torch.log1p(gap_right),
        torch.where(left, cos_left, 0.0), torch.where(right, cos_right, 0.0),
        torch.where(left, attn_left, floor), torch.where(right, attn[..., 1:m], floor),
    ], dim=-1)
    return stats  # (b, h, c, 6)


def _group_query(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    b, h, _ = view.positions.shape
    g = ext.num_groups
    if st.queries is None or st.filled == 0:
        return torch.zeros(b, h, c, 2 * g, device=view.keys.device)
    keys = view.prerope_keys(c)  # (b, h, c, d); raises, naming what is missing, without the model's RoPE
    slots = st.last_slots(ext.window)
    inv_freq, scaling = view.rope
    q = unrotate_keys(st.queries.index_select(2, slots), st.query_pos.index_select(1, slots)[:, None, :], inv_freq,
                      scaling)  # (b, Hq, w, d)
    ok = st.query_ok.index_select(1, slots)[:, None, None, :, None]  # (b, 1, 1, w, 1)
    d = q.shape[-1]
    logits = q.view(b, h, g, -1, d) @ keys[:, :, None].transpose(-1, -2) / math.sqrt(d)  # (b, h, g, w, c)
    count = ok.sum(3).clamp(min=1)
    mean = (logits * ok).sum(3) / count
    high = logits.masked_fill(~ok, float("-inf")).amax(3)
    high = torch.where(ok.any(3), high, torch.zeros_like(high))
    return torch.cat([mean, high], dim=2).transpose(-1, -2)  # (b, h, c, 2g)


def _group_recency(view: EvictView, ext: Any, st: LayerState, c: int) -> torch.Tensor:
    b, h, n = view.positions.shape
    g = ext.num_groups
    if st.seen is None:  # nothing observed yet: every entry just arrived
        pos = view.positions[:, :, None, :c].expand(b, h, g, c)
        last, mri = pos, torch.zeros_like(pos)
    else:
        last, mri = st.seen[..., :c], st.mri[..., :c]
    now = view.positions.amax(-1)[:, :, None, None] + 1
    stats = torch.stack([torch.log1p((now - last).clamp(min=0).float()), torch.log1p(mri.float())], dim=3)
    return stats.reshape(b, h, g * 2, c).transpose(-1, -2)  # (b, h, c, 2g): per query head (since, mri)


#: name -> (width given (head_dim, num_groups), builder); builders return (b, Hkv, C, width) fp32.
FEATURE_GROUPS: dict[str, tuple[Callable[[int, int], int], Callable]] = {
    "key": (lambda d, g: d, _group_key),
    "value": (lambda d, g: d, _group_value),
    "attn": (lambda d, g: ATTN_STATS * g, _group_attn),
    "age": (lambda d, g: 1, _group_age),
    "recency": (lambda d, g: 2 * g, _group_recency),
    "prekey": (lambda d, g: d, _group_prekey),
    "neighbors": (lambda d, g: 6, _group_neighbors),
    "query": (lambda d, g: 2 * g, _group_query),
}
DEFAULT_FEATURE_SET = ("key", "value", "attn")
#: Groups whose columns depend only on the cache entry, fixed once it is written (not on the event): training stores
#: them once per entry and position (:mod:`training.packed_events`). The others change from event to event.
STATIC_GROUPS = ("key", "value", "prekey")


def check_feature_set(feature_set) -> tuple[str, ...]:
    """Validate a feature set (names from :data:`FEATURE_GROUPS`, no repeats) and return it as a tuple."""
    if isinstance(feature_set, str):
        feature_set = [s.strip() for s in feature_set.split(",") if s.strip()]
    fs = tuple(feature_set)
    bad = [f for f in fs if f not in FEATURE_GROUPS]
    if bad or not fs or len(set(fs)) != len(fs):
        raise ValueError(
            f"invalid feature set {list(fs)}: choose distinct names from {', '.join(FEATURE_GROUPS)}"
        )
    return fs


def feature_dim(feature_set, head_dim: int, num_groups: int) -> int:
    """Width D of the per-candidate feature vector."""
    return sum(FEATURE_GROUPS[f][0](head_dim, num_groups) for f in check_feature_set(feature_set))


def feature_columns(feature_set, source_set, head_dim: int, num_groups: int) -> list[int]:
    """Column indices that pick ``feature_set`` (in its order) out of features built with ``source_set``.

    Groups are computed independently of each other, so features of a subset equal the matching columns of
    the superset's features (training caches the full set once and selects columns per experiment).
    """
    feature_set, source_set = check_feature_set(feature_set), check_feature_set(source_set)
    offsets, start = {}, 0
    for name in source_set:
        width = FEATURE_GROUPS[name][0](head_dim, num_groups)
        offsets[name] = (start, start + width)
        start += width
    missing = [f for f in feature_set if f not in offsets]
    if missing:
        raise ValueError(f"feature groups {missing} are not in the source features {list(source_set)}")
    return [i for name in feature_set for i in range(*offsets[name])]
