"""The relaxed ``learned`` eviction of ``foresight train e2e``: the scorer's top-k as soft keep-weights in attention.

At every eviction event the hard trajectory is the ``learned`` policy's own (top-k of the scorer's adjusted scores,
the candidate sets and features exactly as it deploys them, with ``spread`` 0). What changes is what the LM attends
to: no entry leaves attention. Each candidate ``i`` of an event gets the log keep-probability

    log p_i = log sigmoid((s_i - t) / tau),   t = (s_(k) + s_(k+1)) / 2

(``s`` the adjusted scores with gradient, ``s_(k)`` the k-th highest, ``k`` the entries kept), and an entry's bias is
the sum of its ``log p`` over every event it went through. Kept entries stay in the cache with their bias; evicted
ones move to a per-layer store of ghost keys/values with the bias they had when they left, and every later query
attends to both, the bias added to its attention logits (:meth:`RelaxedLearnedPolicy.extend_attention`, called by
:func:`foresight.attention.attend`). As ``tau -> 0`` the kept entries' bias goes to 0 and the evicted entries' to
``-inf``: the hard ``learned`` replay; ``tau = 0`` is that limit exactly (bias 0 / ``-inf`` from the hard choice).

Gradients reach the scorer through every bias term (the threshold included); the features, the candidate sets
and the hard choice carry none (straight-through on the trajectory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from foresight.policies.learned import LearnedPolicy
from foresight.views import chunk_causal


def log_keep(scores: torch.Tensor, graded: torch.Tensor, keep: torch.Tensor, tau: float) -> torch.Tensor:
    """Log keep-probabilities (batch, Hkv, C) of one event's candidates.

    ``scores``: the cache's detached scores (``+inf`` protected, ``-inf`` padding); ``graded``: the same scores with
    their graph (finite); ``keep``: the hard choice (batch, Hkv, k). ``tau = 0``: 0 for kept, ``-inf`` for evicted."""
    kept = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, keep, True)
    if tau == 0:
        return torch.zeros_like(graded).masked_fill(~kept, float("-inf"))
    finite = torch.isfinite(scores)
    s = torch.where(finite, graded, scores.to(graded.dtype))
    k = keep.shape[-1]
    top = s.topk(min(k + 1, s.shape[-1]), dim=-1).values
    hi = top[..., k - 1]
    lo = top[..., k] if top.shape[-1] > k else hi - 1.0
    both = torch.isfinite(hi) & torch.isfinite(lo)
    thr = torch.where(both, (hi + lo) / 2, torch.where(torch.isfinite(lo), lo, hi - 1.0))
    x = (torch.where(finite, s, torch.zeros_like(s)) - thr[..., None]) / tau
    out = F.logsigmoid(x)
    out = torch.where(scores == float("inf"), torch.zeros_like(out), out)
    return torch.where(scores == float("-inf"), torch.full_like(out, float("-inf")), out)


@dataclass
class RelaxedLearnedPolicy(LearnedPolicy):
    """``learned`` (top-k, ``spread`` 0) whose evictions are soft keep-weights in attention (module docstring).

    ``tau``: the relaxation's temperature (0: the hard limit). Not registered as a policy name: training builds it.
    """

    selects_rows: ClassVar[bool] = False  # per-row biases and ghost entries of its own
    tau: float = 0.01
    _raw: Any = field(default=None, init=False, repr=False)
    _graded: Any = field(default=None, init=False, repr=False)
    _bias: list = field(default_factory=list, init=False, repr=False)
    _ghosts: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        if self.spread is None:
            self.spread = 0.0  # the relaxation is of plain top-k
        if self.selection is None:
            self.selection = "topk"
        if self.on_features is not None:
            raise ValueError("the relaxed learned policy takes no on_features callback")
        super().__post_init__()
        if self.applied_selection != "topk" or self.spread:
            raise ValueError("the relaxed learned policy relaxes plain top-k (selection=topk, spread=0)")
        if self.compile:
            raise ValueError("the relaxed learned policy runs its events eagerly (its scores keep their graph); "
                             "drop compile")
        if not self.tau >= 0:
            raise ValueError(f"tau must be >= 0, got {self.tau}")

    @property
    def scores_layers(self) -> bool:
        return False  # layer by layer: each layer's scores keep their graph (_layer_scores)

    def config(self) -> dict:
        cfg = super().config()
        cfg["tau"] = self.tau
        return cfg

    def reset(self, batch_size, num_layers, device, num_groups: int = 1, fingerprint=None, **meta):
        super().reset(batch_size, num_layers, device, num_groups=num_groups, fingerprint=fingerprint, **meta)
        self._bias = [None] * num_layers  # per cache slot: the summed log-keep of the entries held (with graph)
        self._ghosts = [None] * num_layers  # evicted (keys, values, bias), attended with their bias

    def _layer_scores(self, view, feats):
        with torch.enable_grad():  # the one scorer pass: with its graph here, detached for the hard choice
            self._raw = self._scorer(feats, layer_idx=view.layer_idx)
        return self._raw.detach()

    def score(self, view):
        out = super().score(view)  # no gradient: the features, the finite check, the adjusted scores
        with torch.enable_grad():
            self._graded = self.adjust(view, self._raw)
        return out

    def select(self, scores, num_keep, view):
        keep = super().select(scores, num_keep, view)
        with torch.enable_grad():
            self._follow(scores, keep, view)
        return keep

    def _follow(self, scores: torch.Tensor, keep: torch.Tensor, view) -> None:
        """Move this event's biases with the hard choice: kept slots keep theirs (+ log p), evicted become ghosts."""
        layer, n, c = view.layer_idx, view.keys.shape[2], view.num_candidates
        lk = log_keep(scores, self._graded, keep, self.tau)
        total = self._slot_bias(layer, n, lk.dtype, lk.device)
        total = total + F.pad(lk, (0, n - c))
        keep_sorted = keep.sort(dim=-1).values
        newest = torch.arange(c, n, device=keep.device).expand(*keep.shape[:2], -1)
        self._bias[layer] = total.gather(-1, torch.cat([keep_sorted, newest], dim=-1))
        kept = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, keep, True)
        gone = kept.to(torch.int8).sort(dim=-1, stable=True).indices[..., : c - keep.shape[-1]]
        d = view.keys.shape[-1]
        ghost = (view.keys.gather(2, gone[..., None].expand(-1, -1, -1, d)),
                 view.values.gather(2, gone[..., None].expand(-1, -1, -1, view.values.shape[-1])),
                 total.gather(-1, gone))
        old = self._ghosts[layer]
        self._ghosts[layer] = ghost if old is None else tuple(torch.cat([a, b], dim=2) for a, b in zip(old, ghost))
        self._graded = self._raw = None

    def _slot_bias(self, layer: int, n: int, dtype, device) -> torch.Tensor:
        """The bias of the layer's ``n`` cache slots: the held entries' sums, 0 for the entries appended since."""
        held = self._bias[layer]
        if held is None:
            return torch.zeros(1, 1, n, dtype=dtype, device=device)
        return F.pad(held, (0, n - held.shape[-1]))

    def extend_attention(self, layer_idx: int, query, key, value, mask):
        """Keys, values and float mask of one attention call with the ghosts and every entry's bias (None before the
        first event: nothing to add). ``mask``: the cache's boolean mask or None (chunk-causal)."""
        held, ghosts = self._bias[layer_idx], self._ghosts[layer_idx]
        if held is None and ghosts is None:
            return None
        b, hq, q = query.shape[:3]
        n, hkv = key.shape[2], key.shape[1]
        g = hq // hkv
        allowed = mask if mask is not None else chunk_causal(q, n, key.device)[None, None]
        bias = self._slot_bias(layer_idx, n, query.dtype, key.device).to(query.dtype)
        bias = bias.expand(b, hkv, n).repeat_interleave(g, dim=1)[:, :, None, :]
        full = bias.masked_fill(~allowed, float("-inf"))
        if ghosts is not None:
            gk, gv, gb = ghosts
            gb = gb.to(query.dtype).expand(b, hkv, -1).repeat_interleave(g, dim=1)[:, :, None, :]
            full = torch.cat([gb.expand(-1, -1, q, -1), full.expand(b, hq, q, n)], dim=-1)
            key, value = torch.cat([gk.to(key.dtype), key], dim=2), torch.cat([gv.to(value.dtype), value], dim=2)
        return key, value, full.expand(b, hq, q, -1)


__all__ = ["RelaxedLearnedPolicy", "log_keep"]
