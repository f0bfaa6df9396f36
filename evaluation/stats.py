"""Paired comparisons of two policies over the same traces: mean difference with a bootstrap 95% interval.

Two policies evaluated on the same traces give per-trace numbers ``a_i`` and ``b_i`` (e.g. loss ratios). Their
per-trace differences ``d_i = a_i - b_i`` remove the trace-to-trace variation both share, so the interval of
``mean(d)`` is far tighter than comparing two pooled means. The interval is the percentile bootstrap (Efron &
Tibshirani 1993, ch. 13): resample the traces with replacement ``n`` times, take the 2.5% and 97.5% quantiles
of the resampled means. An interval that excludes 0 says the difference is not trace-sampling noise.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n: int = 10000, seed: int = 0,
                     level: float = 0.95) -> dict:
    """Mean paired difference ``mean(a - b)`` and its percentile-bootstrap interval over traces.

    Returns ``{"mean", "ci_low", "ci_high", "n_traces", "level"}``; with fewer than two pairs the interval is
    NaN (nothing to resample). Raises ``ValueError`` on different lengths or an empty input.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired_bootstrap needs two equal-length 1-d sequences, got {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("paired_bootstrap needs at least one pair")
    if n < 1 or not 0 < level < 1:
        raise ValueError(f"need n >= 1 and 0 < level < 1, got n={n} level={level}")
    d = x - y
    out = {"mean": float(d.mean()), "ci_low": float("nan"), "ci_high": float("nan"), "n_traces": int(d.size),
           "level": level}
    if d.size >= 2:
        rng = np.random.default_rng(seed)
        means = d[rng.integers(0, d.size, size=(n, d.size))].mean(axis=1)
        tail = (1.0 - level) / 2 * 100
        out["ci_low"], out["ci_high"] = (float(v) for v in np.percentile(means, [tail, 100 - tail]))
    return out


__all__ = ["paired_bootstrap"]
