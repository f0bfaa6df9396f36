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

from foresight.errors import ForesightError


def _resamples(size: int, n: int, seed: int) -> np.ndarray:
    """``n`` bootstrap resamples of ``size`` traces, as an (n, size) index array."""
    return np.random.default_rng(seed).integers(0, size, size=(n, size))


def _interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of bootstrap ``samples`` at ``level``."""
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def _members(groups: Sequence, size: int) -> tuple[np.ndarray, int]:
    """Each pair's group (its index among the sorted distinct labels) and the number of groups."""
    if len(groups) != size:
        raise ValueError(f"groups needs one label per pair, got {len(groups)} for {size} pairs")
    labels, member = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    return member, int(labels.size)


def _check_finite(**sides: np.ndarray) -> None:
    """Refuse a NaN or infinite per-trace value: it would turn a mean and every resample into NaN, or into a number
    that is not a measurement (a hand-edited or corrupt results file)."""
    for name, v in sides.items():
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise ForesightError(f"{bad.size} of {v.size} per-trace values are not finite ({name}[{bad[0]}] = "
                                 f"{v[bad[0]]}); a loss ratio is a positive finite number")


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n: int = 10000, seed: int = 0,
                     level: float = 0.95, groups: Sequence | None = None) -> dict:
    """Mean paired difference ``mean(a - b)`` and its percentile-bootstrap interval over traces.

    ``groups`` (one label per pair, e.g. the problem a trace samples) resamples whole groups instead of pairs, the
    cluster bootstrap: several traces of one problem are not independent, and resampling them one by one gives too
    narrow an interval. Each resample's statistic is the mean over the pairs of its drawn groups; with one pair per
    group this is the ordinary bootstrap, draw for draw.

    Returns ``{"mean", "ci_low", "ci_high", "n_traces", "level"}`` (and ``n_groups`` with ``groups``); with fewer
    than two pairs (groups) the interval is
    NaN (nothing to resample). Raises ``ValueError`` on different lengths or an empty input and
    :class:`~foresight.errors.ForesightError` on a value that is not finite.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired_bootstrap needs two equal-length 1-d sequences, got {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("paired_bootstrap needs at least one pair")
    if n < 1 or not 0 < level < 1:
        raise ValueError(f"need n >= 1 and 0 < level < 1, got n={n} level={level}")
    _check_finite(x=x, y=y)
    d = x - y
    out = {"mean": float(d.mean()), "ci_low": float("nan"), "ci_high": float("nan"), "n_traces": int(d.size),
           "level": level}
    sums, counts = d, np.ones_like(d)
    if groups is not None:
        member, out["n_groups"] = _members(groups, d.size)
        sums, counts = np.bincount(member, weights=d), np.bincount(member).astype(np.float64)
    if sums.size >= 2:
        idx = _resamples(sums.size, n, seed)
        out["ci_low"], out["ci_high"] = _interval(sums[idx].sum(axis=1) / counts[idx].sum(axis=1), level)
    return out


def gap_share_bootstrap(stage: Sequence[float], worse: Sequence[float], better: Sequence[float], n: int = 10000,
                        seed: int = 0, level: float = 0.95, groups: Sequence | None = None) -> dict:
    """Share of the ``worse`` -> ``better`` gap that ``stage`` closes, on per-trace means, with its bootstrap interval.

    ``share = (mean(worse) - mean(stage)) / (mean(worse) - mean(better))`` over the same traces (e.g. per-trace loss
    ratios of the best heuristic, golden and a learned stage); the interval resamples traces jointly, as
    :func:`paired_bootstrap` does, or with ``groups`` whole groups (the cluster bootstrap: each resample's three
    means are over the traces of its drawn groups). Resamples whose gap is not positive are dropped (``n_dropped``);
    the share and its interval are NaN when the full sample's gap is not positive, and the interval is NaN when more
    than ``(1 - level) / 2`` of the resamples have no gap (a percentile of what remains would be a number with no
    meaning: "nan% [-1183%, 3%]" was printed). Returns ``{"share", "ci_low", "ci_high", "n_traces", "n_dropped",
    "level"}`` (and ``n_groups`` with ``groups``).
    """
    s, w, b = (np.asarray(v, dtype=np.float64) for v in (stage, worse, better))
    if not s.shape == w.shape == b.shape or s.ndim != 1 or s.size == 0:
        raise ValueError(f"gap_share_bootstrap needs three equal-length non-empty 1-d sequences, got {s.shape}, "
                         f"{w.shape} and {b.shape}")
    _check_finite(stage=s, worse=w, better=b)
    gap = w.mean() - b.mean()
    out = {"share": float((w.mean() - s.mean()) / gap) if gap > 0 else float("nan"), "ci_low": float("nan"),
           "ci_high": float("nan"), "n_traces": int(s.size), "n_dropped": 0, "level": level}
    sums, counts = np.stack([s, w, b]), np.ones_like(s)
    if groups is not None:
        member, out["n_groups"] = _members(groups, s.size)
        sums = np.stack([np.bincount(member, weights=v) for v in (s, w, b)])
        counts = np.bincount(member).astype(np.float64)
    if counts.size >= 2:
        idx = _resamples(counts.size, n, seed)
        ms, mw, mb = sums[:, idx].sum(axis=2) / counts[idx].sum(axis=1)
        ok = mw - mb > 0
        out["n_dropped"] = int(n - ok.sum())
        if gap > 0 and out["n_dropped"] <= (1 - level) / 2 * n:
            out["ci_low"], out["ci_high"] = _interval((mw[ok] - ms[ok]) / (mw[ok] - mb[ok]), level)
    return out


def mean_bootstrap(values: Sequence[float], n: int = 10000, seed: int = 0, level: float = 0.95,
                   groups: Sequence | None = None) -> dict:
    """The mean of per-trace values (e.g. one policy's loss ratios) with its percentile-bootstrap interval; with
    ``groups`` whole groups are resampled (the cluster bootstrap of :func:`paired_bootstrap`). Returns
    ``{"mean", "ci_low", "ci_high", "n_traces", "level"}`` (and ``n_groups``)."""
    x = np.asarray(values, dtype=np.float64)
    return paired_bootstrap(x, np.zeros_like(x), n=n, seed=seed, level=level, groups=groups)


def pooled_bootstrap(ce: dict[str, Sequence[float]], ce_full: Sequence[float], worse: str | None = None,
                     better: str | None = None, n: int = 10000, seed: int = 0, level: float = 0.95,
                     groups: Sequence | None = None) -> dict:
    """Pooled loss ratios ``sum(ce_p) / sum(ce_full)`` of several policies over the same traces, with intervals, and
    (given ``worse`` and ``better``) each policy's pooled share of the ``worse`` -> ``better`` gap with its own
    interval.

    ``ce[p][i]`` is policy ``p``'s CE summed over trace ``i``'s scored positions and ``ce_full[i]`` the full cache's
    over the same positions, so a long trace weighs by its tokens, as the pooled ratio does. Every resample draws
    traces (or, with ``groups``, whole groups) jointly for all policies and recomputes each pooled ratio and share
    from the drawn sums. Returns ``{"ratio": {p: {"value", "ci_low", "ci_high"}}, "share": {p: {...}}, "n_traces",
    "level"}``; a resample with no positive gap is dropped from the share's interval (``n_dropped``), and the
    share's interval is NaN when more than ``(1 - level) / 2`` of them are.
    """
    names = list(ce)
    full = np.asarray(ce_full, dtype=np.float64)
    sums = np.stack([np.asarray(ce[p], dtype=np.float64) for p in names] + [full])  # (P + 1, traces)
    if sums.ndim != 2 or sums.shape[1] == 0:
        raise ValueError("pooled_bootstrap needs the same non-empty number of traces for every policy")
    _check_finite(**{p: sums[i] for i, p in enumerate(names)}, ce_full=full)
    if groups is not None:
        member, _ = _members(groups, sums.shape[1])
        sums = np.stack([np.bincount(member, weights=row) for row in sums])
    ratios = sums[:-1].sum(axis=1) / sums[-1].sum()
    nan = float("nan")
    draws = None
    if sums.shape[1] >= 2:
        idx = _resamples(sums.shape[1], n, seed)
        drawn = sums[:, idx].sum(axis=2)  # (P + 1, n)
        draws = drawn[:-1] / drawn[-1]
    out = {"ratio": {}, "share": {}, "n_traces": int(full.size), "level": level}
    for i, p in enumerate(names):
        lo, hi = _interval(draws[i], level) if draws is not None else (nan, nan)
        out["ratio"][p] = {"value": float(ratios[i]), "ci_low": lo, "ci_high": hi}
    if worse is None or better is None:
        return out
    w, b = names.index(worse), names.index(better)
    gap = ratios[w] - ratios[b]
    for i, p in enumerate(names):
        share = {"value": float((ratios[w] - ratios[i]) / gap) if gap > 0 else nan, "ci_low": nan, "ci_high": nan,
                 "n_dropped": 0}
        if draws is not None:
            g = draws[w] - draws[b]
            ok = g > 0
            share["n_dropped"] = int(n - ok.sum())
            if gap > 0 and share["n_dropped"] <= (1 - level) / 2 * n:
                share["ci_low"], share["ci_high"] = _interval((draws[w][ok] - draws[i][ok]) / g[ok], level)
        out["share"][p] = share
    return out


__all__ = ["gap_share_bootstrap", "mean_bootstrap", "paired_bootstrap", "pooled_bootstrap"]
