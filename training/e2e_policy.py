"""The relaxed ``learned`` eviction of ``foresight train e2e``: the scorer's top-k as soft keep-weights in attention.

At every eviction event the hard trajectory is the ``learned`` policy's own (top-k of the scorer's adjusted scores,
the candidate sets and features exactly as it deploys them, with ``spread`` 0). What changes is what the LM attends
to: no entry leaves attention. Each candidate ``i`` of an event gets the log keep-probability

    log p_i = log sigmoid((s_i - t) / tau),   t = (s_(k) + s_(k+1)) / 2

(``s`` the adjusted scores with gradient, ``s_(k)`` the k-th highest, ``k`` the entries kept), and an entry's bias is
the sum of its ``log p`` over every event it went through (an evicted entry keeps the bias it left with). Every
later query attends to every token fed so far, the bias added to its attention logits. As ``tau -> 0`` the kept
entries' bias goes to 0 and the evicted entries' to ``-inf``: the hard ``learned`` replay; ``tau = 0`` is that limit
exactly (bias 0 / ``-inf`` from the hard choice).

The policy keeps, per layer, every token's keys and values and a bias per token (column), and the hard cache's map
from slots to columns. The hard trajectory of a layer depends on that layer's keys, queries and hard-cache attention
only, not on its relaxed attention output. So the runtime lets the cache observe and evict piece by piece, the
policy recording the bias each piece's queries see (:meth:`RelaxedLearnedPolicy.piece_bias`), and the relaxed
attention of all the pieces of a layer-major span (one piece in piecewise replay) runs as one SDPA call over every
column with a (queries x columns) float mask (:meth:`RelaxedLearnedPolicy.relaxed_attention`, called by
:mod:`foresight.attention`).

Gradients reach the scorer through every bias term (the threshold included); the features, the candidate sets
and the hard choice carry none (straight-through on the trajectory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from transformers.integrations.sdpa_attention import sdpa_attention_forward

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

    selects_rows: ClassVar[bool] = False  # per-row bias columns and stored entries of its own
    tau: float = 0.01
    _raw: Any = field(default=None, init=False, repr=False)
    _graded: Any = field(default=None, init=False, repr=False)
    _cum: list = field(default_factory=list, init=False, repr=False)
    _col: list = field(default_factory=list, init=False, repr=False)
    _rows: list = field(default_factory=list, init=False, repr=False)
    _store: list = field(default_factory=list, init=False, repr=False)

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
        self._cum = [None] * num_layers  # (batch, Hkv, columns): every token's summed log-keep (with graph)
        self._col = [None] * num_layers  # (batch, Hkv, slots): the column of each hard-cache slot
        self._rows = [[] for _ in range(num_layers)]  # the bias each piece since the last attention call sees
        self._store = [None] * num_layers  # (keys, values) of every column

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
        """Add this event's log keep-probabilities to its candidates' columns and follow the hard choice's slots
        (the cache keeps the chosen candidates in slot order, then the newest entries)."""
        layer, n, c = view.layer_idx, view.keys.shape[2], view.num_candidates
        col = self._col[layer]
        if col is None or col.shape[-1] != n:
            raise RuntimeError(f"layer {layer}: the relaxed policy follows {0 if col is None else col.shape[-1]} "
                               f"slots, the cache holds {n}")
        lk = log_keep(scores, self._graded, keep, self.tau)
        self._cum[layer] = self._cum[layer].to(lk.dtype).scatter_add(-1, col[..., :c], lk)
        newest = torch.arange(c, n, device=keep.device).expand(*keep.shape[:2], -1)
        self._col[layer] = col.gather(-1, torch.cat([keep.sort(dim=-1).values, newest], dim=-1))
        self._graded = self._raw = None

    def piece_bias(self, layer_idx: int, key: torch.Tensor, new: int) -> None:
        """A piece of ``new`` tokens entered the layer (``key``: the layer's cache keys, for shape and device), before
        its event: new columns of bias 0, and the bias row its queries see."""
        cum, col = self._cum[layer_idx], self._col[layer_idx]
        b, hkv = key.shape[:2]
        start = 0 if cum is None else cum.shape[-1]
        cols = torch.arange(start, start + new, device=key.device).expand(b, hkv, new)
        self._col[layer_idx] = cols if col is None else torch.cat([col, cols], dim=-1)
        dtype = self._scorer.w1.dtype
        self._cum[layer_idx] = cum = (torch.zeros(b, hkv, new, dtype=dtype, device=key.device) if cum is None
                                      else F.pad(cum, (0, new)))
        self._rows[layer_idx].append(cum)

    def relaxed_attention(self, module, query, key, value, kwargs: dict):
        """The relaxed attention of the pieces entered since the last call: ``query`` (batch, Hq, s, d) their queries,
        ``key``/``value`` (batch, Hkv, s, d) their own entries. One SDPA over every column so far, each query with
        the bias row of its piece and causal; returns SDPA's (batch, s, Hq, d) output and None."""
        layer = module.layer_idx
        rows, self._rows[layer] = self._rows[layer], []
        old = self._store[layer]
        if old is not None:
            key, value = torch.cat([old[0], key], dim=2), torch.cat([old[1], value], dim=2)
        self._store[layer] = (key, value)
        b, hq, s = query.shape[:3]
        hkv, t = key.shape[1], key.shape[2]
        start, bias = t - s, []
        for row in rows:  # a piece's queries are the columns its row was extended by
            end = row.shape[-1]
            bias.append(F.pad(row, (0, t - end))[:, :, None, :].expand(b, hkv, end - start, t))
            start = end
        if start != t:
            raise RuntimeError(f"layer {layer}: {len(rows)} pieces of bias for {s} queries")
        mask = torch.cat(bias, dim=2).to(query.dtype).masked_fill(~chunk_causal(s, t, key.device), float("-inf"))
        g = hq // hkv
        mask = mask.repeat_interleave(g, dim=1) if g > 1 else mask
        return sdpa_attention_forward(module, query, key, value, mask, **{**kwargs, "is_causal": False})


__all__ = ["RelaxedLearnedPolicy", "log_keep"]
