"""Recorded events read in place: memory-mapped from their safetensors files, one copy for every rank.

Distillation and DAgger train on every recorded event's features (E, L, Hkv, C, D): about 1.8 MB per event at
B=64 with key/value features. Concatenated in each rank's RAM they exhausted 24 GiB with two ranks at 120 traces
plus one DAgger round. Here the features stay in the per-trace files they were saved to
(:class:`training.sl_features.FeatureCache`, DAgger's rows files), mapped read-only: the pages live once in the
page cache, shared by the ranks and reclaimable, and a batch copies only its own events and feature columns. Files
are packed (:mod:`training.packed_events`: an entry's key and value columns once per trace, rebuilt per batch);
dense ones, of earlier versions, are read as they are. The targets (α, evict flags, positions: about 65 KB per event
at B=64) are read in place the same way: cloned and concatenated in each rank, 60k events of a third DAgger round
took 12 GB per rank and the run was killed for memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from training.packed_events import DensePart

#: safetensors dtype names -> torch dtypes (those the feature and rows files use, and a few more)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def map_safetensors(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(metadata, {name: tensor})`` of a safetensors file, each tensor a read-only view of the mapped file
    (nothing is read until used; nothing is unpickled). Raises ``ValueError`` on a malformed or truncated file."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise ValueError("file too short for a safetensors header")
    buf = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)  # MAP_PRIVATE: never written
    n = int.from_bytes(buf[:8].numpy().tobytes(), "little")
    if not 0 < n <= size - 8:
        raise ValueError(f"header length {n} does not fit a {size}-byte file")
    try:
        header = json.loads(buf[8 : 8 + n].numpy().tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable header ({exc})") from None
    meta = header.pop("__metadata__", None) or {}
    base, out = 8 + n, {}
    for name, info in header.items():
        dtype = _DTYPES.get(info.get("dtype"))
        start, end = info.get("data_offsets", (0, -1))
        shape = [int(s) for s in info.get("shape", [])]
        numel = int(torch.Size(shape).numel())
        if dtype is None or not 0 <= start <= end <= size - base or end - start != numel * dtype.itemsize:
            raise ValueError(f"tensor {name!r}: bad dtype, shape or offsets")
        try:
            out[name] = buf[base + start : base + end].view(dtype).view(shape)
        except RuntimeError as exc:  # misaligned for its dtype
            raise ValueError(f"tensor {name!r}: {exc}") from None
    return meta, out


class EventRows:
    """Per-event tensors held in several parts (one per trace, typically mapped), addressed as one (E, ...) array:
    features (E, L, Hkv, C, D) of the columns ``columns`` of the last dim (None: all), or a target (E, L, Hkv, C).

    A part is a dense (E, ...) tensor or a :class:`~training.packed_events.PackedPart` (anything with
    ``shape``, ``dtype`` and ``take(idx, columns)``). ``rows[idx]`` (an index tensor, list, int or slice) returns a
    new in-memory tensor of those events; ``shape`` and ``len`` describe the whole. Nothing else is materialised.
    """

    def __init__(self, parts: list, columns: torch.Tensor | None = None):
        parts = [DensePart(p) if isinstance(p, torch.Tensor) else p for p in parts]
        parts = [p for p in parts if p.shape[0]]
        if not parts:
            raise ValueError("no events")
        inner = parts[0].shape[1:]
        bad = [tuple(p.shape[1:]) for p in parts if p.shape[1:] != inner]
        if bad:
            raise ValueError(f"event shapes differ: {tuple(inner)} vs {bad[0]}")
        if len({p.dtype for p in parts}) > 1:
            raise ValueError(f"event dtypes differ: {sorted({str(p.dtype) for p in parts})}")
        self.parts, self.columns = parts, columns
        self.counts = torch.tensor([p.shape[0] for p in parts])
        self.starts = torch.cumsum(self.counts, 0) - self.counts
        width = inner[-1] if columns is None else len(columns)
        self.shape = torch.Size((int(self.counts.sum()), *inner[:-1], width))
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx) -> torch.Tensor:
        if isinstance(idx, slice):
            idx = torch.arange(len(self))[idx]
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        if idx.numel() and (int(idx.min()) < -len(self) or int(idx.max()) >= len(self)):
            raise IndexError(f"event index out of range for {len(self)} events")
        idx = idx % max(len(self), 1)
        if not idx.numel():
            return torch.zeros(0, *self.shape[1:], dtype=self.dtype)
        seg = torch.searchsorted(self.starts, idx, right=True) - 1
        out = torch.empty(len(idx), *self.shape[1:], dtype=self.dtype)
        for s in seg.unique().tolist():  # one read per trace, then each event back to its place
            where = (seg == s).nonzero().reshape(-1)
            out.index_copy_(0, where, self.parts[s].take(idx[where] - self.starts[s], self.columns))
        return out

    def dense_parts(self) -> list[torch.Tensor]:
        """The parts as tensors, in order (their concatenation is ``self[:]``), without reading them: for a digest
        over events that never sit in memory at once. Raises ``ValueError`` for a column selection or packed
        parts."""
        if self.columns is not None or not all(isinstance(p, DensePart) for p in self.parts):
            raise ValueError("dense_parts: only dense parts without a column selection")
        return [p.features for p in self.parts]

    @classmethod
    def cat(cls, items: list["EventRows"]) -> "EventRows":
        """The events of ``items`` in order (their column selections must agree)."""
        cols = items[0].columns
        if any((it.columns is None) != (cols is None) or (cols is not None and not torch.equal(it.columns, cols))
               for it in items):
            raise ValueError("EventRows.cat: column selections differ")
        return cls([p for it in items for p in it.parts], cols)
