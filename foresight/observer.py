"""How the budgeted cache shows a forward's queries to its policy, with decode steps held until the next event.

Policies that read attention (``observes = True``) see every forward of every layer. A policy that also sets
``observes_layers`` gets decode steps differently: each step's query (one row per sequence, no mask, entries in
the shared buffers) is *held*, and at the next event (or once :attr:`Observer.observe_bytes` worth of attention
probabilities would be needed) the policy sees every held step of every layer at once, as one chunk of queries
over the cache (:class:`~foresight.views.LayersView`, causal over the held steps' own entries). Nothing is evicted
in between, so the held queries see exactly the entries they saw when they were decoded, and the cached keys are
read once per event instead of once per token: the same chunked observation that replay makes. Any step that
cannot be held (a multi-token forward, padding, gradients) first hands over what is held.
"""

from __future__ import annotations

import torch

from foresight.kv_storage import SharedBuffers
from foresight.views import LayersView, StepView, chunk_causal


class Observer:
    """Hands each forward's queries to ``policy``; holds decode steps (see the module docstring)."""

    #: held decode steps are handed over before their attention probabilities would exceed this size (bytes)
    observe_bytes: int = 64 << 20

    def __init__(self, policy, shared: SharedBuffers):
        self.policy, self.shared = policy, shared
        self.layers = shared.layers
        self._step_rows: dict[int, torch.Tensor] = {}  # this step's held query per layer
        self._held: list[torch.Tensor] = []  # complete held steps: queries of all layers (L, b, Hq, 1, d)
        self._held_pos: list[torch.Tensor] = []  # and their positions (b, 1)
        self._scaling: float | None = None
        self._appended = [0] * len(self.layers)  # entries each layer appended in the current step

    def begin_step(self, first: bool) -> None:
        """A forward starts (``first``: of a new sequence, so nothing held is still relevant)."""
        if first:
            self._held, self._held_pos = [], []
        self._step_rows = {}  # a forward that failed midway leaves nothing for this one
        self._appended = [0] * len(self.layers)

    def appended(self, layer_idx: int, count: int) -> None:
        self._appended[layer_idx] += count

    def observe(self, layer_idx: int, query, keys, values, mask, scaling, positions, step: int,
                hold: bool = True) -> None:
        """One layer's new queries (``positions`` (b, q)); held when it is a decode step the policy takes at once
        (and ``hold``: a layer-major span observes each piece at once)."""
        if not getattr(self.policy, "observes", False):
            return
        if hold and self._holdable(layer_idx, query, mask, scaling):
            self._step_rows[layer_idx] = query  # a fresh tensor of this forward, never written again
            self._scaling = scaling
            return
        self.flush(step)  # older steps first
        with torch.no_grad():  # policies keep statistics, never a graph (a replay with gradients stays lean)
            self._observe(layer_idx, query, keys, values, mask, scaling, positions, step)

    def _holdable(self, layer_idx: int, query, mask, scaling) -> bool:
        return (mask is None and query.shape[2] == 1 and self.policy.observes_layers
                and self.layers[layer_idx]._buffers is not None
                and (scaling == self._scaling or not (self._held or self._step_rows)))

    def end_step(self, positions: torch.Tensor, step: int) -> None:
        """The forward is over: its held queries join the held steps (a step not every layer held is observed)."""
        rows, self._step_rows = self._step_rows, {}
        if len(rows) == len(self.layers):
            self._held.append(torch.stack([rows[i] for i in range(len(rows))]))
            self._held_pos.append(positions)
        elif rows:
            self.flush(step)
            with torch.no_grad():
                for i, query in sorted(rows.items()):
                    layer = self.layers[i]
                    self._observe(i, query, layer.keys, layer.values, None, self._scaling, positions, step)
        self._appended = [0] * len(self.layers)

    def hold(self, queries: torch.Tensor, positions: torch.Tensor, scaling: float | None) -> None:
        """Hold decode steps observed elsewhere (:mod:`foresight.static_cache`): ``queries`` (L, b, Hq, k, d) of
        every layer, ``positions`` (b, k); the policy sees them at the next :meth:`flush`."""
        self._held.append(queries)
        self._held_pos.append(positions)
        self._scaling = scaling

    def over_cap(self, n: int) -> bool:
        """True when observing the held steps over ``n`` entries would take more than :attr:`observe_bytes`."""
        return bool(self._held) and 4 * len(self._held) * self._held[0][..., 0, 0].numel() * n >= self.observe_bytes

    def flush(self, step: int) -> None:
        """Hand every held step to the policy: one :class:`LayersView` of all layers, or, in the middle of a
        forward, each layer's :class:`StepView` over its entries before that forward."""
        if not self._held:
            return
        # the mode the held steps ran in (a caller may flush outside it): the policy's state was made there too
        with torch.inference_mode() if self._held[0].is_inference() else torch.no_grad():
            query, pos = torch.cat(self._held, dim=3), torch.cat(self._held_pos, dim=1)
            self._held, self._held_pos = [], []
            k = query.shape[3]
            if not any(self._appended) and all(layer._buffers is not None for layer in self.layers):
                n, shared = self.layers[0].get_seq_length(), self.shared
                self.policy.observe_layers(LayersView(
                    query=query, keys=shared.keys(n), values=shared.values(n), positions=shared.positions(n),
                    valid=shared.valid(n), query_positions=pos, step=step, scaling=self._scaling,
                    mask=chunk_causal(k, n, query.device)[None, None] if k > 1 else None))
                return
            for i, layer in enumerate(self.layers):
                n = layer.get_seq_length() - self._appended[i]
                mask = chunk_causal(k, n, query.device)[None, None] if k > 1 else None
                self._observe(i, query[i], layer.keys[..., :n, :], layer.values[..., :n, :], mask, self._scaling,
                              pos, step)

    def _observe(self, layer_idx: int, query, keys, values, mask, scaling, positions, step: int) -> None:
        """The policy's ``observe`` of one layer: ``query`` over its first ``keys.shape[2]`` entries."""
        layer = self.layers[layer_idx]
        q, n = query.shape[2], keys.shape[2]
        if mask is None and q > 1:
            # SDPA runs this step with is_causal=True and no mask; the policy's probabilities must be causal too.
            mask = chunk_causal(q, n, keys.device)[None, None]
        self.policy.observe(StepView(
            layer_idx=layer_idx, query=query, keys=keys, values=values, positions=layer.positions[..., :n],
            valid=layer.valid[..., :n], query_positions=positions, mask=mask, step=step, scaling=scaling))
