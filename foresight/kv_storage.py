"""Where the budgeted cache keeps its entries: capacity buffers shared by all layers.

Every layer of a :class:`~foresight.cache.BudgetedCache` holds the same number of entries at every step (all
layers append the same tokens and evict the same count), so the keys, values, logical positions and validity
flags of all layers live in four buffers of shape (L, batch, Hkv, capacity[, d]) (:class:`SharedBuffers`); a
layer's tensors are views of its slice. Capacity doubles when a step needs more, for every layer at once, so a
bounded cache stops allocating once warm, a decode step writes one slot instead of concatenating four tensors,
and the keys of all layers form one (L, batch, Hkv, n, d) view: the attention of a decode step over every layer
is one batched product (:meth:`foresight.cache.BudgetedCache.end_step`).

**Gradients.** Writing into a buffer in place would overwrite tensors that autograd saved for the backward pass.
While gradients are recorded and the keys or values require them (a replay with ``grad=True``, e.g.
``foresight train adapt``), a layer holds plain tensors instead and appends and gathers out of place
(``torch.cat`` / ``gather``), so gradients flow into every cached entry a later query attends to; the next
append without gradients copies its entries back into the shared buffers.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class SharedBuffers:
    """Keys, values, positions and validity of every layer, (L, batch, Hkv, capacity[, d]) each."""

    def __init__(self, num_layers: int):
        self.layers: list[BudgetedLayer] = [BudgetedLayer(self, i) for i in range(num_layers)]
        self.tensors: list[torch.Tensor] | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.tensors is None else self.tensors[0].shape[3]

    def fits(self, like: list[torch.Tensor]) -> bool:
        """True when the buffers hold entries shaped, typed and placed like ``like`` (one step's four tensors)."""
        return self.tensors is not None and all(
            buf.shape[1:3] == t.shape[:2] and buf.shape[4:] == t.shape[3:] and buf.dtype == t.dtype
            and buf.device == t.device for buf, t in zip(self.tensors, like))

    def grow(self, like: list[torch.Tensor], need: int) -> None:
        """Room for ``need`` entries in every layer; every layer's current entries are copied over."""
        held = [layer.get_seq_length() for layer in self.layers]
        cap = max(need, 2 * max(held), 64)
        grown = [t.new_empty(len(self.layers), t.shape[0], t.shape[1], cap, *t.shape[3:]) for t in like]
        for layer, n in zip(self.layers, held):
            if n:
                for buf, cur in zip(grown, (layer.keys, layer.values, layer.positions, layer.valid)):
                    buf[layer.layer_idx, :, :, :n] = cur
        self.tensors = grown
        for layer, n in zip(self.layers, held):
            layer._attach(n)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` of every layer (the other rows' entries are dropped)."""
        held = [layer.get_seq_length() for layer in self.layers]
        self.tensors = [t.index_select(1, rows) for t in self.tensors]
        for layer, n in zip(self.layers, held):
            layer._attach(n)

    def keys(self, n: int) -> torch.Tensor:
        """(L, batch, Hkv, n, d) view of every layer's keys."""
        return self.tensors[0][:, :, :, :n]

    def values(self, n: int) -> torch.Tensor:
        return self.tensors[1][:, :, :, :n]

    def positions(self, n: int) -> torch.Tensor:
        """(L, batch, Hkv, n) view of every layer's logical positions."""
        return self.tensors[2][:, :, :, :n]

    def valid(self, n: int) -> torch.Tensor:
        return self.tensors[3][:, :, :, :n]

    def holds(self, layers: range) -> bool:
        """True when the layers ``layers`` are all views of these buffers, recording no gradients (so their
        tensors stack for free and :meth:`gather` may write them in place)."""
        chosen = [self.layers[i] for i in layers]
        return self.tensors is not None and all(layer._buffers is not None and not layer._tracks_grad()
                                                for layer in chosen)

    def gather(self, layers: range, keep: torch.Tensor) -> None:
        """:meth:`BudgetedLayer.gather` of the layers ``layers`` at once (they :meth:`holds`), ``keep`` (L, batch,
        Hkv, k): one gather per buffer instead of four per layer."""
        n, k = self.layers[layers.start].get_seq_length(), keep.shape[-1]
        for buf in self.tensors:
            part = buf[layers.start : layers.stop, :, :, :n]
            idx = keep if part.dim() == 4 else keep[..., None].expand(*keep.shape, part.shape[-1])
            part[:, :, :, :k] = part.gather(3, idx)
        for i in layers:
            self.layers[i]._expose(k)


class BudgetedLayer(DynamicLayer):
    """One layer's keys/values with per-entry logical positions and validity, shape (batch, Hkv, n).

    ``keys``/``values``/``positions``/``valid`` are views of the first ``n`` slots of the layer's slice of the
    :class:`SharedBuffers` (or plain tensors while gradients are recorded, see the module docstring).
    """

    def __init__(self, shared: SharedBuffers, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        self.shared, self.layer_idx = shared, layer_idx
        self.positions: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        self._buffers: list[torch.Tensor] | None = None  # this layer's slices of shared.tensors

    def _tracks_grad(self, *tensors) -> bool:
        """True when autograd records and some of ``tensors`` (or the cached keys/values) require gradients."""
        if not torch.is_grad_enabled():
            return False
        return any(t is not None and t.requires_grad for t in (*tensors, self.keys, self.values))

    def _attach(self, n: int) -> None:
        """Point this layer at its slice of the shared buffers, holding ``n`` entries."""
        self._buffers = [t[self.layer_idx] for t in self.shared.tensors]
        if n:
            self._expose(n)

    def append(self, key_states, value_states, positions, valid):
        b, hkv, q = key_states.shape[:3]
        n = 0 if self.keys is None else self.keys.shape[-2]
        new = [key_states, value_states, positions[:, None, :].expand(-1, hkv, -1),
               valid[:, None, :].expand(-1, hkv, -1)]
        if self._tracks_grad(key_states, value_states):  # out of place: autograd keeps what it saved
            cur = (self.keys, self.values, self.positions, self.valid)
            self.keys, self.values, self.positions, self.valid = (
                t if c is None else torch.cat([c, t], dim=2) for c, t in zip(cur, new))
            self._buffers = None
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            return self.keys, self.values
        if self._buffers is None or n + q > self._buffers[0].shape[2]:
            shared = self.shared
            if not shared.fits(new) or n + q > shared.capacity:
                shared.grow(new, n + q)  # every layer at once (the others hold as many entries as this one)
            elif self._buffers is None:  # back from plain tensors (a step with gradients): copy them in
                for buf, cur in zip(shared.tensors, (self.keys, self.values, self.positions, self.valid)):
                    if n:
                        buf[self.layer_idx, :, :, :n] = cur
                self._attach(n)
        if not self.is_initialized:  # a layer attached by another layer's growth
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        for buf, t in zip(self._buffers, new):
            buf[:, :, n : n + q] = t
        self._expose(n + q)
        return self.keys, self.values

    def _expose(self, n: int) -> None:
        self.keys, self.values, self.positions, self.valid = (buf[:, :, :n] for buf in self._buffers)

    def gather(self, keep: torch.Tensor) -> None:
        """Keep entries ``keep`` (batch, Hkv, k), per KV head, in the given order."""
        kept = [
            self.keys.gather(2, keep[..., None].expand(-1, -1, -1, self.keys.shape[-1])),
            self.values.gather(2, keep[..., None].expand(-1, -1, -1, self.values.shape[-1])),
            self.positions.gather(2, keep),
            self.valid.gather(2, keep),
        ]
        k = keep.shape[-1]
        if self._buffers is None or self._tracks_grad():
            self.keys, self.values, self.positions, self.valid = kept
            self._buffers = None
            return
        for buf, t in zip(self._buffers, kept):
            buf[:, :, :k] = t
        self._expose(k)

    def detach_(self) -> None:
        """Cut the autograd history of the cached keys and values (truncated backpropagation)."""
        if self.keys is not None and self._buffers is None:
            self.keys, self.values = self.keys.detach(), self.values.detach()

    def reset(self) -> None:
        super().reset()
        self.positions = self.valid = self._buffers = None
