"""CAOTE: rescale an attention score by each value's contribution to the attention output.

Goel et al., "CAOTE: KV Caching through Attention Output Error based Token Eviction", 2025.
https://arxiv.org/abs/2504.14051
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foresight.policies.base import EvictionPolicy
from foresight.policies.registry import make_policy, register_policy


@register_policy
@dataclass
class CAOTEPolicy(EvictionPolicy):
    """CAOTE wrapper: ``score_i = a_i · ‖v_i − o‖`` with ``a_i`` the inner policy's attention score.

    Evicting token ``i`` changes the attention output ``o = Σ_j p_j v_j`` of the newest query by
    ``p_i / (1 − p_i) · (o − v_i)`` after renormalisation; CAOTE ranks tokens by that error. We use the common
    approximation ``a_i · ‖v_i − o‖`` so that any nonnegative attention-mass score (``h2o``'s cumulative
    attention, ``tova``'s current attention, ``snapkv``'s window sum) can be wrapped, ``o`` being the output of
    the newest query (before the event), per query head, and the distance averaged over the GQA group.

    Build it as ``make_policy("caote:h2o")`` or ``make_policy("caote", inner="tova")``. Hooks (reset, observe,
    observe_layers, on_evict, check_cache, select) are forwarded to the inner policy.

    Parameters
    ----------
    inner
        The wrapped policy (name or instance) whose scores are attention mass: h2o, tova or snapkv.
    inner_kwargs
        Hyperparameters of the inner policy when it is given by name.
    """

    name = "caote"
    observes = True
    inner: EvictionPolicy | str = "h2o"
    inner_kwargs: dict | None = None

    def __post_init__(self):
        if isinstance(self.inner, str):
            self.inner = make_policy(self.inner, **(self.inner_kwargs or {}))
        elif self.inner_kwargs:
            raise ValueError("caote: inner_kwargs only apply when inner is given by name")
        if not getattr(self.inner, "attention_score", False):
            raise ValueError(
                "caote wraps policies whose scores are attention mass (h2o, tova, snapkv), got "
                f"{getattr(self.inner, 'name', self.inner)!r}"
            )

    @property
    def per_layer(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner, "per_layer", False))

    @property
    def observes_layers(self) -> bool:  # type: ignore[override]
        """Held decode steps, all layers at once, when the inner policy takes them so (h2o, tova and snapkv do)."""
        return bool(getattr(self.inner, "observes_layers", False))

    @property
    def selects_rows(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner, "selects_rows", False))

    def select_rows(self, rows):
        self.inner.select_rows(rows)
        self._out = [None if out is None else out.index_select(0, rows) for out in self._out]

    def config(self) -> dict:
        return {"inner": self.inner.name, "inner_kwargs": self.inner.config()}

    def check_cache(self, budget, interval):
        self.inner.check_cache(budget, interval)

    def reset(self, batch_size, num_layers, device, **meta):
        self.inner.reset(batch_size, num_layers, device, **meta)
        self._out: list[torch.Tensor | None] = [None] * num_layers

    def observe(self, view):
        if self.inner.observes:
            self.inner.observe(view)
        p = view.probs[:, :, :, -1, :]  # (b, Hkv, G, n): newest query
        self._out[view.layer_idx] = p @ view.values.float()  # (b, Hkv, G, d)

    def observe_layers(self, view):
        """The newest query's output of every layer in one product, and the inner policy's :meth:`observe_layers`
        (sharing the view's attention)."""
        out = view.probs[..., -1, :] @ view.values.float()  # (L, b, Hkv, G, d)
        self.inner.observe_layers(view)
        for i in range(view.num_layers):
            self._out[i] = out[i]

    def score(self, view):
        out = self._out[view.layer_idx]
        if out is None:
            raise RuntimeError("caote: no attention output observed for the current cache of this layer")
        v = view.values[..., : view.num_candidates, :].float()  # (b, Hkv, nc, d)
        dist = (v[:, :, None] - out[:, :, :, None]).norm(dim=-1).mean(dim=2)  # (b, Hkv, nc)
        return self.inner.score(view).float() * dist

    def select(self, scores, num_keep, view):
        return self.inner.select(scores, num_keep, view)

    def on_evict(self, layer_idx, keep):
        self.inner.on_evict(layer_idx, keep)
        self._out[layer_idx] = None

    def end_event(self):
        self.inner.end_event()
