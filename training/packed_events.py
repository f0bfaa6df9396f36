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

A file holds every feature group (a feature cache with ``feature_cache_groups: all``: feature-set sweeps select
columns of one extraction) or a subset of them, in ``FEATURE_GROUPS`` order (the scorer's groups: DAgger's rows, and
the feature cache by default), named in its metadata (:func:`layout_metadata`). Either way its columns are addressed
as those of the full feature vector, so one column selection reads both kinds; selecting a group a file lacks is
refused.

:func:`pack` checks that every static column recorded twice for one (layer, head, position) is bit-identical, so
a layout that would change a single feature is refused rather than written. A :class:`PackedPart` rebuilds the
dense features of any events and any column selection; a :class:`DensePart` wraps a dense tensor (files written
before this layout, in-memory events) behind the same interface.
"""

from __future__ import annotations

import torch

from foresight.errors import ForesightError
from foresight.feature_groups import FEATURE_GROUPS, STATIC_GROUPS, check_feature_set, feature_columns, feature_dim

#: layout name recorded in a file's metadata (absent: the dense layout of earlier files)
PACKED_LAYOUT = "packed/1"
ALL_GROUPS = tuple(FEATURE_GROUPS)
DYNAMIC_GROUPS = tuple(g for g in ALL_GROUPS if g not in STATIC_GROUPS)


def recorded_groups(feature_set) -> tuple[str, ...]:
    """The groups of ``feature_set`` in ``FEATURE_GROUPS`` order: what a file recording only them holds."""
    wanted = set(check_feature_set(feature_set))
    return tuple(g for g in ALL_GROUPS if g in wanted)


def layout_metadata(head_dim: int, num_groups: int, groups=ALL_GROUPS) -> dict[str, str]:
    """The metadata keys of a packed file of ``groups`` (``groups`` only when it is not every group: files of
    every group keep the bytes of earlier versions)."""
    meta = {"layout": PACKED_LAYOUT, "head_dim": str(head_dim), "num_groups": str(num_groups)}
    if tuple(groups) != ALL_GROUPS:
        meta["groups"] = ",".join(groups)
    return meta


def _layout(head_dim: int, num_groups: int, groups=ALL_GROUPS) -> tuple[dict[str, list[int]], list[int]]:
    """Columns of the full feature vector (``FEATURE_GROUPS`` order) held by each static group of ``groups``, and
    the columns of its dynamic groups in their order."""
    static = {g: feature_columns((g,), ALL_GROUPS, head_dim, num_groups) for g in groups if g in STATIC_GROUPS}
    dynamic = [g for g in groups if g not in STATIC_GROUPS]
    return static, feature_columns(dynamic, ALL_GROUPS, head_dim, num_groups) if dynamic else []


def packed_bytes(cells: int, table_cells: int, head_dim: int, num_groups: int, dtype: torch.dtype,
                 groups=ALL_GROUPS) -> int:
    """Feature bytes of a packed trace of ``groups``: ``cells`` recorded (event, layer, head, candidate) cells,
    ``table_cells`` (layer, head, position) cells of the static tables."""
    static, dynamic = _layout(head_dim, num_groups, groups)
    return (cells * len(dynamic) + table_cells * sum(len(c) for c in static.values())) * dtype.itemsize


def pack(features: torch.Tensor, positions: torch.Tensor, head_dim: int, num_groups: int,
         groups=ALL_GROUPS) -> dict[str, torch.Tensor]:
    """The packed tensors (module docstring) of one trace's dense ``features`` (E, L, Hkv, C, D) of ``groups`` (in
    ``FEATURE_GROUPS`` order: :func:`recorded_groups`), recorded at ``positions`` (E, L, Hkv, C). Raises
    :class:`ForesightError` when a static column differs between two events of one entry (the features were not
    recorded from one trajectory)."""
    groups = tuple(groups)
    if groups != recorded_groups(groups):
        raise ForesightError(f"cannot pack feature groups {list(groups)}: they must be in the order "
                             f"{', '.join(ALL_GROUPS)}")
    width = feature_dim(groups, head_dim, num_groups)
    if features.shape[-1] != width or features.shape[:-1] != positions.shape:
        raise ForesightError(f"cannot pack features {tuple(features.shape)} at positions {tuple(positions.shape)}: "
                             f"expected (E, L, Hkv, C, {width}) and (E, L, Hkv, C)")
    static, dynamic = _layout(head_dim, num_groups, groups)
    local = {c: i for i, c in enumerate(feature_columns(groups, ALL_GROUPS, head_dim, num_groups))}
    e, layers, heads, c = positions.shape
    out = {"dynamic": features[..., [local[col] for col in dynamic]].contiguous()}
    pos = positions.long()
    if pos.numel() and int(pos.min()) < 0:
        raise ForesightError("cannot pack features recorded at negative positions")
    n = int(pos.max()) + 1 if pos.numel() else 0
    # every recorded cell's row in a flat (L * Hkv * N) table
    row = ((torch.arange(layers)[:, None, None] * heads + torch.arange(heads)[None, :, None]) * n)[None] + pos
    row = row.reshape(-1)
    for group, cols in static.items():
        vals = features[..., [local[col] for col in cols]].reshape(-1, len(cols))
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

    def check(self, columns: torch.Tensor | None) -> None:
        """Every column is there (a dense part holds them all)."""

    def take(self, idx: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        x = self.features.index_select(0, idx)  # a fancy index of a mapped tensor is several times slower
        return x if columns is None else x.index_select(-1, columns)


class PackedPart:
    """Events of one trace in the packed layout (module docstring), of ``groups``; its columns are those of the full
    feature vector. :meth:`take` reads only the tables of the static groups that the selected columns use."""

    def __init__(self, tensors: dict[str, torch.Tensor], positions: torch.Tensor, head_dim: int, num_groups: int,
                 groups=ALL_GROUPS):
        self.groups = tuple(groups)
        static, dynamic = _layout(head_dim, num_groups, self.groups)
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
        if self.static and positions.numel() and \
                int(positions.max()) >= min(t.shape[2] for t in self.static.values()):
            raise ValueError("a recorded position lies beyond the static tables")
        self._static_cols, self._dynamic_cols = static, dynamic
        self.head_dim, self.num_groups = head_dim, num_groups
        self.shape = torch.Size((e, layers, heads, c, feature_dim(ALL_GROUPS, head_dim, num_groups)))
        self.dtype = self.dynamic.dtype
        self._plans: dict[tuple | None, list[tuple[str | None, torch.Tensor | None]]] = {}

    def check(self, columns: torch.Tensor | None) -> None:
        """Raise ``ValueError`` naming the feature groups of ``columns`` (None: all) that this part does not hold."""
        have = set(c for cols in self._static_cols.values() for c in cols) | set(self._dynamic_cols)
        wanted = range(self.shape[-1]) if columns is None else columns.tolist()
        if all(c in have for c in wanted):
            return
        lacking = [g for g in ALL_GROUPS if g not in self.groups and any(
            c in wanted for c in feature_columns((g,), ALL_GROUPS, self.head_dim, self.num_groups))]
        raise ValueError(f"it holds the feature groups {', '.join(self.groups)}, not {', '.join(lacking)}")

    def _plan(self, columns: torch.Tensor | None) -> list[tuple[str | None, _Selection]]:
        """The selected columns as runs read from one source each, in order: ``(group, selection)`` for a static
        group's table and ``(None, selection)`` for the dynamic tensor, each selection of that source's columns
        (:func:`_selection`)."""
        key = None if columns is None else tuple(columns.tolist())
        if key not in self._plans:
            self.check(columns)
            source = {col: (g, i) for g, cols in self._static_cols.items() for i, col in enumerate(cols)}
            source.update({col: (None, i) for i, col in enumerate(self._dynamic_cols)})
            runs: list[tuple[str | None, list[int]]] = []
            for col in range(self.shape[-1]) if key is None else key:
                g, i = source[col]
                if runs and runs[-1][0] == g:
                    runs[-1][1].append(i)
                else:
                    runs.append((g, [i]))
            width = {g: len(c) for g, c in self._static_cols.items()} | {None: len(self._dynamic_cols)}
            self._plans[key] = [(g, _selection(cols, width[g])) for g, cols in runs]
        return self._plans[key]

    def take(self, idx: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        pos = self.positions.index_select(0, idx).long()  # (n, L, Hkv, C)
        n, layers, heads, c = pos.shape
        rows, pieces = None, []
        for g, sel in self._plan(columns):
            if g is None:
                pieces.append(_select(self.dynamic.index_select(0, idx), sel))
                continue
            table = self.static[g]
            if rows is None:  # each cell's row in a table flattened to (L * Hkv * N, width)
                rows = (torch.arange(layers * heads).view(1, layers, heads, 1) * table.shape[2] + pos).reshape(-1)
            x = table.reshape(-1, table.shape[-1]).index_select(0, rows).view(n, layers, heads, c, -1)
            pieces.append(_select(x, sel))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, -1)


#: columns of one source: None (all, in order), a slice (a run of consecutive ones) or an index tensor (any others)
_Selection = None | slice | torch.Tensor


def _selection(cols: list[int], width: int) -> _Selection:
    """The cheapest selection of ``cols`` out of ``width`` columns: slicing copies nothing, and a strided copy of a
    slice is several times faster than ``index_select`` over the last dimension."""
    if cols == list(range(width)):
        return None
    if cols == list(range(cols[0], cols[0] + len(cols))):
        return slice(cols[0], cols[0] + len(cols))
    return torch.tensor(cols, dtype=torch.long)


def _select(x: torch.Tensor, sel: _Selection) -> torch.Tensor:
    """The columns ``sel`` of ``x``'s last dimension."""
    if sel is None:
        return x
    return x[..., sel] if isinstance(sel, slice) else x.index_select(-1, sel)


def mapped_features(meta: dict, tensors: dict[str, torch.Tensor], positions: torch.Tensor):
    """A saved file's features: a :class:`PackedPart` (packed layout, of the groups its metadata names: every group
    when it names none) or the dense mapped tensor (files written before it). Raises ``ValueError`` on an unknown
    layout or groups."""
    layout = meta.get("layout")
    if layout is None:
        return tensors["features"]
    if layout != PACKED_LAYOUT:
        raise ValueError(f"unknown layout {layout!r}")
    groups = tuple(meta["groups"].split(",")) if "groups" in meta else ALL_GROUPS
    if groups != recorded_groups(groups):
        raise ValueError(f"feature groups {meta['groups']!r} are not in the order {', '.join(ALL_GROUPS)}")
    return PackedPart(tensors, positions, int(meta["head_dim"]), int(meta["num_groups"]), groups)
