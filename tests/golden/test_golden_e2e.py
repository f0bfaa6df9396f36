"""End to end on the default model: trace -> golden labels -> golden replay beats the heuristics."""

from __future__ import annotations

import pytest
import torch

from foresight import replay
from foresight.data import load_problems
from foresight.policies import make_policy
from golden.labels import check_labels_match, load_labels
from golden.pipeline import label_traces
from golden.traces import generate_traces, load_traces

BUDGET, INTERVAL = 64, 16


def loss_ratio(ce: torch.Tensor, ce_full: torch.Tensor, start: int) -> float:
    """Mean CE over positions >= start (pooled over traces, padding excluded) over the full cache's."""
    ev, full = ce[:, start:], ce_full[:, start:]
    ok = ~(ev.isnan() | full.isnan())
    return float(ev[ok].mean() / full[ok].mean())


@pytest.mark.slow
def test_golden_end_to_end_on_smollm2(smollm2, tmp_path):
    model, tok = smollm2
    problems = load_problems("math500", limit=4)
    traces_dir = generate_traces(
        model, tok, problems, tmp_path / "traces", samples=1, max_new_tokens=200, temperature=0.6, top_p=0.95,
        top_k=20, seed=0, batch_size=4, progress=False,
    )
    traces = load_traces(traces_dir)
    assert len(traces) == 4
    summary = label_traces(model, traces_dir, tmp_path / "golden", BUDGET, INTERVAL, progress=False)
    assert (summary.planned, summary.skipped) == (4, 0)
    labels = load_labels(tmp_path / "golden")
    check_labels_match(labels, model, BUDGET, INTERVAL)
    assert sorted(labels) == sorted(traces["trace_id"])
    seqs = traces["input_ids"]
    for t, seq in zip(traces["trace_id"], seqs):
        assert len(labels[t].events) == (len(seq) - BUDGET - INTERVAL) // INTERVAL + 1
        ev = labels[t].events[0]
        assert ev.candidates.shape == (30, 3, BUDGET) and ev.evicted.shape == (30, 3, INTERVAL)

    full = replay(model, seqs, policy="full")
    ratios = {}
    for name, kwargs in [("golden", {"labels": labels}), ("streaming_llm", {}), ("random", {"seed": 0})]:
        res = replay(
            model, seqs, policy=make_policy(name, **kwargs), budget=BUDGET, interval=INTERVAL,
            trace_ids=traces["trace_id"],
        )
        ratios[name] = loss_ratio(res.ce, full.ce, BUDGET + INTERVAL)
    print(f"\nloss ratios on smollm2-135m, 4 math500 traces, B={BUDGET} W={INTERVAL}: {ratios}")
    assert ratios["golden"] <= ratios["streaming_llm"]
    assert ratios["golden"] <= ratios["random"]
    assert ratios["golden"] >= 0.9  # evicting cannot help much; a ratio far below 1 would mean a broken replay
