"""One trace's recorded events and their file: the type that the feature cache and DAgger's rows share.

Distillation records, along the golden trajectory, and each DAgger round, along its mixture policy's trajectory, the
same thing at every event of one replay (docs/training.md, distillation and DAgger): every candidate's features (E,
L, Hkv, C, D; of the scorer's groups, or in the feature cache of every group), its foresight
value α, whether the oracle evicts it from *this* cache, and its position. :class:`RecordedEvents` holds one trace's;
:func:`save_events` writes them packed (:mod:`training.packed_events`) and atomically, :func:`load_events` reads them
back memory-mapped (:mod:`training.mapped_events`) whatever their layout, :func:`repack_events` rewrites files of the
earlier dense layout packed (no replay), and :func:`concat_events` joins many traces' into what training reads
(:func:`join_events` appends such joins). The two kinds of file differ only in the ``format`` recorded in their
metadata (:data:`training.sl_features.FEATURE_CACHE_FORMAT`, :data:`training.onpolicy.ROWS_FORMAT`) and in whatever
else their writer records there (the feature cache: each trace's identity).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from foresight.atomic import atomic_file
from foresight.errors import ForesightError
from foresight.safetensors_file import save_safetensors
from golden.labels import TraceLabels
from training.mapped_events import EventRows, map_safetensors
from training.packed_events import ALL_GROUPS, PackedPart, layout_metadata, mapped_features, pack, packed_bytes

TARGETS = ("alpha", "evicted", "positions")


@dataclass
class RecordedEvents:
    """One trace's recorded events: features (E, L, Hkv, C, D) of the recorded feature groups, α of the candidates, the
    oracle's evict set for that cache (bool) and the candidates' positions, (E, L, Hkv, C). ``features`` is a dense
    tensor as recorded, or a :class:`~training.packed_events.PackedPart` as read from a packed file
    (``EventRows([ev.features], columns)[:]`` reads the same columns of either)."""

    trace_id: str
    features: torch.Tensor | PackedPart
    alpha: torch.Tensor
    evicted: torch.Tensor
    positions: torch.Tensor


def stack_events(trace_id: str, per_event: list[dict[int, tuple]], num_layers: int) -> RecordedEvents:
    """One trace's events from what a replay recorded: per event (in order) ``{layer: (features, alpha, evicted,
    positions)}`` with every layer present."""
    fields = [torch.stack([torch.stack([ev[layer][i] for layer in range(num_layers)]) for ev in per_event])
              for i in range(4)]
    return RecordedEvents(trace_id, *fields)


def save_events(path: Path, ev: RecordedEvents, head_dim: int, num_groups: int, fmt: str,
                metadata: dict[str, str] | None = None, groups=ALL_GROUPS) -> None:
    """Write ``ev`` (dense features of ``groups``, in ``FEATURE_GROUPS`` order) packed, atomically
    (:func:`~foresight.atomic.atomic_file`: a killed run never leaves a torn file), with the writer's ``metadata``;
    ``fmt``, the trace id and the layout are recorded over any such keys in it. The header's metadata keys are
    sorted (:func:`~foresight.safetensors_file.save_safetensors`): identical runs write identical bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = pack(ev.features, ev.positions, head_dim, num_groups, groups)
    tensors.update(alpha=ev.alpha.contiguous(), evicted=ev.evicted.to(torch.uint8).contiguous(),
                   positions=ev.positions.contiguous())
    layout = layout_metadata(head_dim, num_groups, groups)
    with atomic_file(path) as tmp:
        save_safetensors(tensors, tmp, metadata={**(metadata or {}), "format": fmt, "trace_id": ev.trace_id,
                                                 **layout})


def saved_metadata(path: Path) -> dict:
    """The metadata of a saved events file without reading its tensors; empty when there is no file or it is
    unreadable (a damaged file is stale: it is recorded again)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except Exception:
        return {}


def _damaged(path: Path, fmt: str, exc: Exception) -> ForesightError:
    return ForesightError(f"{path} is not a readable {fmt} file ({' '.join(str(exc).split())}); delete it and rerun "
                          "to record it again")


def read_events(path: Path, fmt: str) -> tuple[dict, RecordedEvents]:
    """``(metadata, events)`` of a saved events file of format ``fmt``, packed or dense; its tensors (features and
    targets) stay memory-mapped, read-only. Raises :class:`ForesightError` (one line) on another format (a file of
    another kind: left as it is) or an unreadable file (damaged: to be recorded again)."""
    try:
        meta, t = map_safetensors(path)
    except (OSError, ValueError) as exc:
        raise _damaged(path, fmt, exc) from None
    if meta.get("format") != fmt:
        raise ForesightError(f"{path} is not a {fmt} file (its format is {meta.get('format')!r}); pass a file or "
                             "directory of that kind")
    try:
        positions, evicted = t["positions"], t["evicted"]
        flags = evicted.view(torch.uint8) if evicted.dtype in (torch.uint8, torch.bool) else None
        if flags is None or (flags.numel() and int(flags.max()) > 1):
            raise ValueError("evict flags are not 0/1 bytes")  # a bool view of other bytes would mislead
        ev = RecordedEvents(meta["trace_id"], mapped_features(meta, t, positions), t["alpha"],
                            evicted.view(torch.bool), positions)  # 0/1 bytes: a bool view, no copy
        return meta, ev
    except (OSError, KeyError, ValueError) as exc:
        raise _damaged(path, fmt, exc) from None


def load_events(path: Path, fmt: str) -> RecordedEvents:
    """The events of a saved events file (:func:`read_events` without the metadata)."""
    return read_events(path, fmt)[1]


def repack_events(paths: list[Path], fmt: str, head_dim: int, num_groups: int, desc: str, show: bool) -> None:
    """Rewrite ``paths`` (files of format ``fmt`` in the dense layout) packed, keeping their writer's metadata
    (:func:`~training.packed_events.pack` checks that the features are unchanged). No replay."""
    for path in tqdm(paths, desc=desc, unit="trace", disable=not (show and paths), dynamic_ncols=True):
        meta, ev = read_events(path, fmt)
        ev.features = ev.features.clone()  # read it all before the file is replaced
        save_events(path, ev, head_dim, num_groups, fmt, meta)  # the layout keys are rewritten, the rest kept


def concat_events(evs: list[RecordedEvents], columns: torch.Tensor | None) -> dict | None:
    """The events of ``evs`` in order, as training reads them: ``features`` (of ``columns``) and the targets α,
    evict flags and positions, each an :class:`~training.mapped_events.EventRows` read in place (``[idx]`` copies
    those events; nothing is concatenated in memory); None if none."""
    if not evs:
        return None
    for e in (e for e in evs if isinstance(e.features, PackedPart)):  # a dense part holds every column
        try:
            e.features.check(columns)
        except ValueError as exc:
            raise ForesightError(f"the recorded events of trace {e.trace_id!r} lack the columns asked for: {exc}; "
                                 "record them again with this feature set") from None
    out = {name: EventRows([getattr(e, name) for e in evs]) for name in TARGETS}
    out["features"] = EventRows([e.features for e in evs], columns)
    return out


def join_events(parts: list[dict]) -> dict:
    """Several :func:`concat_events` results as one, in order (their column selections must agree); still read in
    place."""
    return {name: EventRows.cat([p[name] for p in parts]) for name in (*TARGETS, "features")}


def events_bytes(labels: TraceLabels, head_dim: int, num_groups: int, dtype: torch.dtype, groups=ALL_GROUPS) -> int:
    """Bytes of the tensors that one trace's recorded events take in its file (:func:`save_events`): at each of the
    labels' events every (layer, KV head, candidate) has its per-event feature columns (of ``groups``) in ``dtype``,
    a float32 α, a uint8 evict flag and an int32 position; the static tables span every position up to the last
    event's newest candidate (the same on any trajectory: the candidates are all but the newest ``W`` entries)."""
    if not labels.events:
        return 0
    cells = sum(ev.candidates.numel() for ev in labels.events)
    layers, heads = labels.events[0].candidates.shape[:2]
    last = max(int(ev.candidates.max()) for ev in labels.events) + 1
    return packed_bytes(cells, layers * heads * last, head_dim, num_groups, dtype, groups) + cells * (4 + 1 + 4)


def check_free_space(where: str | Path, need: int, what: str, remedy: str) -> None:
    """Refuse, in one line, ``what`` (about to write ``need`` bytes under ``where``) when that disk has less free:
    a disk that fills halfway through a replay wastes the replay."""
    if need <= 0:
        return
    disk = Path(where)
    while not disk.exists():  # a directory still to create: its disk is its nearest existing parent's
        disk = disk.parent
    free = shutil.disk_usage(disk).free
    if need > free:
        raise ForesightError(f"{what} will write about {need / 1e9:.3g} GB under {where}, but only "
                             f"{free / 1e9:.3g} GB is free there; {remedy}")
