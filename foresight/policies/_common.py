"""Building blocks shared by the attention-based heuristics (not a policy; not auto-registered).

* :func:`reduce_group` folds the G query heads of a GQA group into their KV head.
* :class:`QueryWindow` keeps, per layer, the attention rows of the last ``w`` queries over the cache and keeps
  them aligned with the cache through every eviction (observation windows of SnapKV / R-KV).
* :func:`pool1d` smooths scores along the token axis (SnapKV / R-KV clustering).
* :func:`check_choice` validates string hyperparameters.

Decode steps bring one query row per step, replay pieces up to ``W`` rows; everything here treats the rows of
one step exactly as if they had arrived one at a time (rows only ever see keys up to their own position, the
columns of later keys being zero), so chunked replay and token-by-token decoding produce the same state.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

GROUP_REDUCTIONS = ("max", "mean", "sum")


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def as_float(name: str, value) -> float:
    """``value`` as a float (numeric strings such as YAML's ``"1e-4"`` accepted), else ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def check_positive_int(name: str, value: int, lo: int = 1) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer >= ``lo``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


def reduce_group(probs: torch.Tensor, how: str, dim: int = 2) -> torch.Tensor:
    """Reduce the GQA group axis ``dim`` of attention probabilities with ``max``, ``mean`` or ``sum``."""
    if how == "max":
        return probs.amax(dim)
    if how == "mean":
        return probs.mean(dim)
    return probs.sum(dim)


def pool1d(scores: torch.Tensor, kernel: int, mode: str) -> torch.Tensor:
    """Same-length 1-D ``max``/``avg`` pooling of (..., n) scores along the last axis (stride 1).

    Even kernels are padded asymmetrically so the output keeps length n. Average pooling divides by the number
    of in-range entries, so the ends are not pulled towards zero.
    """
    if kernel <= 1 or mode == "none":
        return scores
    shape = scores.shape
    x = scores.reshape(-1, 1, shape[-1])
    left = (kernel - 1) // 2
    right = kernel - 1 - left
    if mode == "max":
        x = F.pad(x, (left, right), value=float("-inf"))
        out = F.max_pool1d(x, kernel, stride=1)
    else:
        x = F.pad(x, (left, right))
        ones = F.pad(torch.ones_like(x[:1, :, left : x.shape[-1] - right]), (left, right))
        out = F.avg_pool1d(x, kernel, stride=1) / F.avg_pool1d(ones, kernel, stride=1)
    return out.reshape(shape)


class QueryWindow:
    """Attention rows of the last ``size`` queries, per layer, aligned with the cache.

    Rows are stored as (batch, Hkv, *extra, w, n): ``push`` appends a step's rows (zero-padding older rows for
    the step's new keys, which those queries could not see), keeps the newest ``size``; ``gather`` keeps the
    key columns the runtime kept at an eviction.
    """

    def __init__(self, size: int):
        self.size = size
        self.rows: list[torch.Tensor | None] = []

    def reset(self, num_layers: int) -> None:
        self.rows = [None] * num_layers

    def push(self, layer_idx: int, rows: torch.Tensor) -> None:
        cur = self.rows[layer_idx]
        if cur is None:
            cur = rows
        else:
            grow = rows.shape[-1] - cur.shape[-1]
            if grow > 0:
                cur = F.pad(cur, (0, grow))
            cur = torch.cat([cur, rows], dim=-2)
        if cur.shape[-2] > self.size:
            cur = cur[..., -self.size :, :]
        self.rows[layer_idx] = cur

    def get(self, layer_idx: int) -> torch.Tensor:
        cur = self.rows[layer_idx]
        if cur is None:
            raise RuntimeError("no attention observed yet for this layer")
        return cur

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows ``rows`` of every layer's window."""
        self.rows = [None if cur is None else cur.index_select(0, rows) for cur in self.rows]

    def gather(self, layer_idx: int, keep: torch.Tensor) -> None:
        cur = self.rows[layer_idx]
        if cur is None:
            return
        b, h, n = cur.shape[0], cur.shape[1], cur.shape[-1]
        flat = cur.reshape(b, h, -1, n)
        idx = keep[:, :, None, :].expand(-1, -1, flat.shape[2], -1)
        self.rows[layer_idx] = flat.gather(-1, idx).reshape(*cur.shape[:-1], keep.shape[-1])
