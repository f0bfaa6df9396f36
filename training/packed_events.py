"""How recorded event features are laid out on disk: per-entry columns once per trace, per-event columns per event.

Distillation and DAgger record, at every event, the features (L, Hkv, C, D) of every candidate
(:mod:`training.sl_features`, :mod:`training.onpolicy`). Most columns do not depend on the event: a cache entry's
key, value and pre-RoPE key are written once, when the entry enters the cache, and never change
(:data:`foresight.feature_groups.STATIC_GROUPS`), yet a candidate is recorded at every event it survives (C/W of
them: 5 at B=64/W=16). Stored densely they were 192 of 223 columns of every row (SmolLM2-135M), and at B=128 a
feature cache of 16 GB plus 15 GB of rows per DAgger round outgrew the page cache: training read them from disk
at random and ran 3-5x slower than round 0.

The packed layout of one trace (one trajectory) stores

* ``static.<group>``: (L, Hkv, N, width) per static group, indexed by the entry's position (N = last position + 1;
  positions never recorded are zero and never read);
* ``dynamic``: (E, L, Hkv, C, width) the other groups' columns (attention statistics, age, recency), in
  ``FEATURE_GROUPS`` order;
* the recorded ``positions`` (E, L, Hkv, C), which address the tables.

:func:`pack` checks that every static column recorded twice for one (layer, head, position) is bit-identical, so
a layout that would change a single feature is refused rather than written. A :class:`PackedPart` rebuilds the
dense features of any events and any column selection; a :class:`DensePart` wraps a dense tensor (files written
before this layout, in-memory events) behind the same interface.
"""

from __future__ import annotations

import torch

from foresight.errors import ForesightError
from foresight.feature_groups import FEATURE_GROUPS, STATIC_GROUPS, feature_columns, feature_dim

#: layout name recorded in a file's metadata (absent: the dense layout of earlier files)
PACKED_LAYOUT = "packed/1"
ALL_GROUPS = tuple(FEATURE_GROUPS)
DYNAMIC_GROUPS = tuple(g for g in ALL_GROUPS if g not in STATIC_GROUPS)


def _layout(head_dim: int, num_groups: int) -> tuple[dict[str, list[int]], list[int]]:
    """Columns of the full feature vector (``FEATURE_GROUPS`` order) held by each static group, and the dynamic
    columns in their order."""
    static = {g: feature_columns((g,), ALL_GROUPS, head_dim, num_groups) for g in ALL_GROUPS if g in STATIC_GROUPS}
    dynamic = feature_columns(DYNAMIC_GROUPS, ALL_GROUPS, head_dim, num_groups) if DYNAMIC_GROUPS else []
    return static, dynamic


def packed_bytes(cells: int, table_cells: int, head_dim: int, num_groups: int, dtype: torch.dtype) -> int:
    """Feature bytes of a packed trace: ``cells`` recorded (event, layer, head, candidate) cells, ``table_cells``
    (layer, head, position) cells of the static tables."""
    static, dynamic = _layout(head_dim, num_groups)
    return (cells * len(dynamic) + table_cells * sum(len(c) for c in static.values())) * dtype.itemsize


def pack(features: torch.Tensor, positions: torch.Tensor, head_dim: int, num_groups: int) -> dict[str, torch.Tensor]:
    """The packed tensors (module docstring) of one trace's dense ``features`` (E, L, Hkv, C, D) of every group,
    recorded at ``positions`` (E, L, Hkv, C). Raises :class:`ForesightError` when a static column differs between
    two events of one entry (the features were not recorded from one trajectory)."""
    width = feature_dim(ALL_GROUPS, head_dim, num_groups)
    if features.shape[-1] != width or features.shape[:-1] != positions.shape:
        raise ForesightError(f"cannot pack features {tuple(features.shape)} at positions {tuple(positions.shape)}: "
                             f"expected (E, L, Hkv, C, {width}) and (E, L, Hkv, C)")
    static, dynamic = _layout(head_dim, num_groups)
    e, layers, heads, c = positions.shape
    out = {"dynamic": features[..., dynamic].contiguous()}
    pos = positions.long()
    if pos.numel() and int(pos.min()) < 0:
        raise ForesightError("cannot pack features recorded at negative positions")
    n = int(pos.max()) + 1 if pos.numel() else 0
    # every recorded cell's row in a flat (L * Hkv * N) table
    row = ((torch.arange(layers)[:, None, None] * heads + torch.arange(heads)[None, :, None]) * n)[None] + pos
    row = row.reshape(-1)
    for group, cols in static.items():
        vals = features[..., cols].reshape(-1, len(cols))
        table = vals.new_zeros(layers * heads * n, len(cols))
        table[row] = vals
        if not torch.equal(table[row], vals):
            raise ForesightError(f"feature group {group!r} differs between two events of one cache entry: these "
                                 "features were not recorded along one trajectory, so they cannot be packed")
        out[f"static.{group}"] = table.view(layers, heads, n, len(cols))
    return out


class DensePart:
    """Events of one trace held as a dense (E, L, Hkv, C, D) tensor (typically mapped)."""

    def __init__(self, features: torch.Tensor):
        self.features = features
        self.shape = features.shape
        self.dtype = features.dtype

    def take(self, idx: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        x = self.features[idx]
        return x if columns is None else x.index_select(-1, columns)


class PackedPart:
    """Events of one trace in the packed layout (module docstring); :meth:`take` reads only the tables of the
    static groups that the selected columns use."""

    def __init__(self, tensors: dict[str, torch.Tensor], positions: torch.Tensor, head_dim: int, num_groups: int):
        static, dynamic = _layout(head_dim, num_groups)
        missing = [f"static.{g}" for g in static if f"static.{g}" not in tensors] + \
            ([] if "dynamic" in tensors else ["dynamic"])
        if missing:
            raise ValueError(f"packed events lack {', '.join(missing)}")
        self.static = {g: tensors[f"static.{g}"] for g in static}
        self.dynamic, self.positions = tensors["dynamic"], positions
        e, layers, heads, c = positions.shape
        if self.dynamic.shape != (e, layers, heads, c, len(dynamic)) or any(
                t.shape[:2] != (layers, heads) or t.shape[3] != len(static[g]) for g, t in self.static.items()):
            raise ValueError("packed tensors do not match the recorded positions")
        if positions.numel() and int(positions.max()) >= min(t.shape[2] for t in self.static.values()):
            raise ValueError("a recorded position lies beyond the static tables")
        self._static_cols, self._dynamic_cols = static, dynamic
        self.head_dim, self.num_groups = head_dim, num_groups
        self.shape = torch.Size((e, layers, heads, c, feature_dim(ALL_GROUPS, head_dim, num_groups)))
        self.dtype = self.dynamic.dtype
        self._plans: dict[tuple | None, list[tuple[str | None, torch.Tensor | None]]] = {}

    def _plan(self, columns: torch.Tensor | None) -> list[tuple[str | None, torch.Tensor | None]]:
        """The selected columns as runs read from one source each, in order: ``(group, local columns)`` for a static
        group's table (None: all of them, in order) and ``(None, local columns)`` for the dynamic tensor."""
        key = None if columns is None else tuple(columns.tolist())
        if key not in self._plans:
            source = {col: (g, i) for g, cols in self._static_cols.items() for i, col in enumerate(cols)}
            source.update({col: (None, i) for i, col in enumerate(self._dynamic_cols)})
            runs: list[tuple[str | None, list[int]]] = []
            for col in range(self.shape[-1]) if key is None else key:
                g, i = source[col]
                if runs and runs[-1][0] == g:
                    runs[-1][1].append(i)
                else:
                    runs.append((g, [i]))
            self._plans[key] = [
                (g, None if g is not None and cols == list(range(len(self._static_cols[g]))) else
                 torch.tensor(cols, dtype=torch.long)) for g, cols in runs]
        return self._plans[key]

    def take(self, idx: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        pos = self.positions[idx].long()  # (n, L, Hkv, C)
        n, layers, heads, c = pos.shape
        rows, pieces = None, []
        for g, cols in self._plan(columns):
            if g is None:
                pieces.append(self.dynamic[idx].index_select(-1, cols))
                continue
            table = self.static[g]
            if rows is None:  # each cell's row in a table flattened to (L * Hkv * N, width)
                rows = (torch.arange(layers * heads).view(1, layers, heads, 1) * table.shape[2] + pos).reshape(-1)
            x = table.reshape(-1, table.shape[-1]).index_select(0, rows).view(n, layers, heads, c, -1)
            pieces.append(x if cols is None else x.index_select(-1, cols))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, -1)


def mapped_features(meta: dict, tensors: dict[str, torch.Tensor], positions: torch.Tensor):
    """A saved file's features: a :class:`PackedPart` (packed layout) or the dense mapped
    tensor (files written before it). Raises ``ValueError`` on an unknown layout."""
    layout = meta.get("layout")
    if layout is None:
        return tensors["features"]
    if layout != PACKED_LAYOUT:
        raise ValueError(f"unknown layout {layout!r}")
    return PackedPart(tensors, positions, int(meta["head_dim"]), int(meta["num_groups"]))
