"""The paired bootstrap and the gap-share bootstrap of evaluation.stats."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.stats import gap_share_bootstrap, paired_bootstrap
from foresight.errors import ForesightError


def test_paired_bootstrap_constant_and_identical_differences():
    a = [1.2, 1.5, 0.9, 1.1]
    same = paired_bootstrap(a, a)
    assert same["mean"] == 0.0 and same["ci_low"] == 0.0 and same["ci_high"] == 0.0 and same["n_traces"] == 4
    shifted = paired_bootstrap([x + 0.25 for x in a], a, n=500)
    assert shifted["mean"] == pytest.approx(0.25) and shifted["ci_low"] == pytest.approx(0.25)
    assert shifted["ci_high"] == pytest.approx(0.25)


def test_paired_bootstrap_interval_against_a_reference():
    rng = np.random.default_rng(0)
    b = rng.normal(1.2, 0.3, 40)  # large trace-to-trace spread shared by both ...
    a = b - 0.02 + rng.normal(0, 0.01, 40)  # ... and a small, consistent improvement
    out = paired_bootstrap(a, b, n=4000, seed=3)
    d = a - b
    assert out["mean"] == pytest.approx(d.mean())
    assert out["ci_low"] < d.mean() < out["ci_high"] < 0  # pairing resolves what pooled means could not
    se = d.std(ddof=1) / math.sqrt(d.size)  # the normal approximation, close for 40 pairs
    assert out["ci_low"] == pytest.approx(d.mean() - 1.96 * se, abs=0.6 * se)
    assert out["ci_high"] == pytest.approx(d.mean() + 1.96 * se, abs=0.6 * se)
    assert paired_bootstrap(a, b, n=4000, seed=3) == out  # seeded


def test_paired_bootstrap_edge_cases():
    one = paired_bootstrap([1.0], [0.5])
    assert one["mean"] == 0.5 and math.isnan(one["ci_low"]) and math.isnan(one["ci_high"])
    with pytest.raises(ValueError):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_bootstrap([], [])


def test_gap_share_bootstrap_against_a_brute_force_resample():
    rng = np.random.default_rng(1)
    golden = rng.normal(1.05, 0.02, 12)
    worse = golden + rng.uniform(0.2, 0.5, 12)
    stage = golden + 0.4 * (worse - golden) + rng.normal(0, 0.02, 12)  # closes about 60% on every trace
    out = gap_share_bootstrap(stage, worse, golden, n=300, seed=5)
    assert out["share"] == pytest.approx((worse.mean() - stage.mean()) / (worse.mean() - golden.mean()))
    idx = np.random.default_rng(5).integers(0, 12, size=(300, 12))  # the same resamples, one at a time
    ref = [(worse[i].mean() - stage[i].mean()) / (worse[i].mean() - golden[i].mean()) for i in idx]
    assert out["ci_low"] == pytest.approx(np.percentile(ref, 2.5))
    assert out["ci_high"] == pytest.approx(np.percentile(ref, 97.5))
    assert 0.5 < out["ci_low"] < out["share"] < out["ci_high"] < 0.7 and out["n_dropped"] == 0


def test_gap_share_bootstrap_edge_cases():
    assert gap_share_bootstrap([1.1], [1.2], [1.0])["share"] == pytest.approx(0.5)
    assert math.isnan(gap_share_bootstrap([1.1], [1.2], [1.0])["ci_low"])
    none = gap_share_bootstrap([1.1, 1.1], [1.0, 1.0], [1.2, 1.2])  # golden worse than the heuristic: no gap
    assert math.isnan(none["share"]) and none["n_dropped"] == 10000 and math.isnan(none["ci_low"])
    # a gap that most resamples lose: the percentiles of the rest meant nothing ("nan% [-1183%, 3%]" was printed)
    thin = gap_share_bootstrap([1.0, 1.3, 1.2, 1.1], [1.0, 1.4, 1.0, 1.0], [1.0, 1.0, 1.2, 1.15], seed=1)
    assert thin["n_dropped"] > 250 and math.isnan(thin["ci_low"]) and math.isnan(thin["ci_high"])
    assert thin["share"] == pytest.approx((1.1 - 1.15) / (1.1 - 1.0875))
    with pytest.raises(ValueError):
        gap_share_bootstrap([1.0, 2.0], [1.0], [1.0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_values_that_are_not_finite_are_refused(bad):
    """A NaN ratio (a corrupt or hand-edited results file) used to turn the mean and the interval into NaN, or an
    inf into a number, without an error."""
    with pytest.raises(ForesightError, match=r"not finite \(x\[1\]"):
        paired_bootstrap([1.1, bad, 1.2], [1.0, 1.0, 1.0])
    with pytest.raises(ForesightError, match=r"not finite \(better\[0\]"):
        gap_share_bootstrap([1.1, 1.2], [1.3, 1.4], [bad, 1.0])


def test_cluster_bootstrap_with_one_pair_per_group_is_the_ordinary_one_and_groups_widen_the_interval():
    rng = np.random.default_rng(1)
    b = rng.normal(1.2, 0.2, 30)
    a = b - 0.01 + rng.normal(0, 0.01, 30)
    plain = paired_bootstrap(a, b, n=2000, seed=5)
    singletons = paired_bootstrap(a, b, n=2000, seed=5, groups=[f"p{i:02d}" for i in range(30)])
    assert {k: singletons[k] for k in plain} == plain and singletons["n_groups"] == 30
    # 6 problems x 5 traces with a shared per-problem effect: resampling traces understates the spread
    effect = np.repeat(rng.normal(0, 0.02, 6), 5)
    a2, groups = b + effect, [f"p{i // 5}" for i in range(30)]
    by_trace, by_problem = paired_bootstrap(a2, b, n=4000, seed=2), paired_bootstrap(a2, b, n=4000, seed=2,
                                                                                      groups=groups)
    assert by_problem["mean"] == by_trace["mean"] and by_problem["n_groups"] == 6
    assert by_problem["ci_high"] - by_problem["ci_low"] > 1.5 * (by_trace["ci_high"] - by_trace["ci_low"])
    # brute force: each resample's statistic is the mean over the pairs of the drawn problems
    d = a2 - b
    idx = np.random.default_rng(2).integers(0, 6, size=(4000, 6))
    stats = [np.concatenate([d[g * 5:(g + 1) * 5] for g in row]).mean() for row in idx]
    assert by_problem["ci_low"] == pytest.approx(np.percentile(stats, 2.5))
    assert by_problem["ci_high"] == pytest.approx(np.percentile(stats, 97.5))
    with pytest.raises(ValueError, match="one label per pair"):
        paired_bootstrap(a, b, groups=["p"] * 3)


def test_gap_share_cluster_bootstrap_against_a_brute_force_resample():
    """The share's interval resampled traces even for traces of one problem (compare.py --by-problem, a quality run
    of 6 traces per problem): 55.8% [47.0%, 63.7%] was reported where problems resampled give [44.7%, 64.4%]."""
    rng = np.random.default_rng(3)
    groups = ["big"] * 9 + [f"p{i}" for i in range(6)]  # one problem with many traces, the others with one
    golden = rng.normal(1.05, 0.02, 15)
    worse = golden + rng.uniform(0.1, 0.5, 15)
    stage = golden + 0.4 * (worse - golden) + np.where(np.arange(15) < 9, 0.08, 0.0)  # the big problem is harder
    out = gap_share_bootstrap(stage, worse, golden, n=400, seed=7, groups=groups)
    assert out["share"] == pytest.approx((worse.mean() - stage.mean()) / (worse.mean() - golden.mean()))
    assert out["n_groups"] == 7 and out["n_traces"] == 15
    labels = sorted(set(groups))
    members = {g: [i for i, x in enumerate(groups) if x == g] for g in labels}
    ref = []
    for row in np.random.default_rng(7).integers(0, 7, size=(400, 7)):  # whole problems, one resample at a time
        i = [t for g in row for t in members[labels[g]]]
        gap = worse[i].mean() - golden[i].mean()
        if gap > 0:
            ref.append((worse[i].mean() - stage[i].mean()) / gap)
    assert out["n_dropped"] == 400 - len(ref)
    assert out["ci_low"] == pytest.approx(np.percentile(ref, 2.5))
    assert out["ci_high"] == pytest.approx(np.percentile(ref, 97.5))
    by_trace = gap_share_bootstrap(stage, worse, golden, n=400, seed=7)
    assert out["ci_high"] - out["ci_low"] > 1.2 * (by_trace["ci_high"] - by_trace["ci_low"])
    # one trace per group: the ordinary bootstrap, draw for draw; one group: nothing to resample
    singletons = gap_share_bootstrap(stage, worse, golden, n=400, seed=7, groups=[f"t{i:02d}" for i in range(15)])
    assert {k: singletons[k] for k in by_trace} == pytest.approx(by_trace)
    assert math.isnan(gap_share_bootstrap(stage, worse, golden, groups=["p"] * 15)["ci_low"])
    with pytest.raises(ValueError, match="one label per pair"):
        gap_share_bootstrap(stage, worse, golden, groups=["p"] * 3)


def test_pooled_bootstrap_against_a_brute_force_resample():
    """Pooled ratios weigh traces by their summed CE (long traces count more); every resample draws the traces
    jointly for all policies, and the pooled share of the gap has its own interval."""
    from evaluation.stats import pooled_bootstrap

    rng = np.random.default_rng(2)
    full = rng.uniform(20, 200, 10)  # summed full-cache CE per trace: traces of very different lengths
    ce = {"golden": full * rng.uniform(1.0, 1.1, 10), "h2o": full * rng.uniform(1.3, 1.6, 10)}
    ce["learned"] = ce["golden"] + 0.3 * (ce["h2o"] - ce["golden"])
    out = pooled_bootstrap(ce, full, worse="h2o", better="golden", n=200, seed=3)
    pooled = {p: v.sum() / full.sum() for p, v in ce.items()}
    assert pooled["learned"] != pytest.approx(np.mean(ce["learned"] / full))  # pooled, not the per-trace mean
    for p in ce:
        assert out["ratio"][p]["value"] == pytest.approx(pooled[p])
    share = (pooled["h2o"] - pooled["learned"]) / (pooled["h2o"] - pooled["golden"])
    assert out["share"]["learned"]["value"] == pytest.approx(share) and share == pytest.approx(0.7)
    idx = np.random.default_rng(3).integers(0, 10, size=(200, 10))
    ref_ratio = [ce["h2o"][i].sum() / full[i].sum() for i in idx]
    ref_share = [(ce["h2o"][i].sum() - ce["learned"][i].sum()) / (ce["h2o"][i].sum() - ce["golden"][i].sum())
                 for i in idx]
    assert out["ratio"]["h2o"]["ci_low"] == pytest.approx(np.percentile(ref_ratio, 2.5))
    assert out["ratio"]["h2o"]["ci_high"] == pytest.approx(np.percentile(ref_ratio, 97.5))
    assert out["share"]["learned"]["ci_low"] == pytest.approx(np.percentile(ref_share, 2.5))
    assert out["share"]["learned"]["ci_high"] == pytest.approx(np.percentile(ref_share, 97.5))
    assert out["share"]["h2o"]["value"] == 0 and out["share"]["golden"]["value"] == 1


def test_mean_bootstrap_is_the_one_sample_interval():
    from evaluation.stats import mean_bootstrap

    x = np.array([1.1, 1.3, 1.2, 1.6, 1.25])
    out = mean_bootstrap(x, n=100, seed=0)
    idx = np.random.default_rng(0).integers(0, 5, size=(100, 5))
    assert out["mean"] == pytest.approx(x.mean())
    assert out["ci_low"] == pytest.approx(np.percentile([x[i].mean() for i in idx], 2.5))
