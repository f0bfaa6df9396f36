"""Where a learned stage closes the gap: the heuristic -> golden gap closed per bucket of trace length.

A pooled share of the gap hides *which* traces a scorer handles. This splits the traces of one quality
benchmark run (golden and a heuristic from its ``quality.json``) by their length in tokens (prompt included, read
from the traces themselves) and reports, per bucket and for each stage, the share of the gap closed on the
bucket's per-trace means: ``(mean(heuristic) - mean(stage)) / (mean(heuristic) - mean(golden))``. Stages are
``FILE:STAGE`` specs as in ``compare.py`` (a ``quality.json`` stage or an ``eval fidelity`` ``fidelity.json``);
every one must come from the same model and traces as the run (checked as ``compare.py`` does).

    python benchmarks/quality/by_length.py --traces runs/quality/aime/traces \\
        --gap runs/quality_B64_aime/quality.json:tova --budget 64 --interval 16 \\
        runs/quality_B64_aime/quality.json:packaged
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evaluation.quality import check_comparable, load_gap_references, load_record, same_traces
from foresight.errors import ForesightError, OneLineParser, run_script
from golden.traces import load_traces


def by_length(traces: str, gap: str, stages: list[str], budget: int, interval: int,
              edges: tuple[int, ...] = (300, 450, 560)) -> list[dict]:
    """One row per length bucket: its trace count, mean length, the gap and each stage's share of it."""
    if list(edges) != sorted(set(edges)) or not edges or edges[0] <= 0:
        raise ForesightError(f"--edges must be increasing positive token counts, got {list(edges)}")
    meta, (_, best), (golden_spec, golden) = load_gap_references(gap, budget, interval)
    ids = same_traces(best, golden, gap, golden_spec)
    recs = {}
    for spec in stages:
        m, rec = load_record(spec, budget, interval)
        check_comparable(meta, best, m, rec, gap, spec)
        same_traces(rec, best, spec, gap)
        recs[spec] = rec
    try:
        lengths = {r["trace_id"]: len(r["input_ids"]) for r in load_traces(traces)}
    except (OSError, ValueError) as exc:
        raise ForesightError(f"{traces}: not readable traces ({exc})") from None
    missing = [t for t in ids if t not in lengths]
    if missing:
        raise ForesightError(f"{traces}: holds no trace {missing[0]!r} ({len(missing)} of the run's traces missing); "
                             "pass the traces the run measured")
    # the run scored the positions >= B+W of each trace but the last: traces of other lengths under the same ids (e.g.
    # regenerated) would be bucketed by lengths the run never measured
    scored = sum(max(0, lengths[t] - 1 - (budget + interval)) for t in ids)
    if scored != best["tokens"]:
        raise ForesightError(f"{traces}: its traces give {scored} scored tokens at B={budget} W={interval}, the run "
                             f"scored {best['tokens']}; not the traces the run measured")
    n = np.array([lengths[t] for t in ids])
    w, g = (np.array([r["per_trace_ratio"][t] for t in ids]) for r in (best, golden))
    bounds = [0, *edges, None]
    rows = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        m = (n >= lo) & (n < hi if hi is not None else True)
        if not m.any():
            continue
        gap_size = float(w[m].mean() - g[m].mean())
        row = {"from": lo, "to": hi, "traces": int(m.sum()), "mean_len": float(n[m].mean()), "gap": gap_size,
               "shares": {}}
        for spec, rec in recs.items():
            s = np.array([rec["per_trace_ratio"][t] for t in ids])
            row["shares"][spec] = float((w[m].mean() - s[m].mean()) / gap_size) if gap_size > 0 else float("nan")
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stages", nargs="+", help="FILE:STAGE (quality.json stage or fidelity.json policy)")
    p.add_argument("--traces", required=True, help="the traces the run measured (`foresight trace` output)")
    p.add_argument("--gap", required=True, metavar="FILE:HEURISTIC", help="a quality.json and its heuristic")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--interval", type=int, required=True)
    p.add_argument("--edges", default="300,450,560", help="bucket edges in tokens (comma-separated)")
    args = p.parse_args(argv)
    try:
        edges = tuple(int(e) for e in args.edges.split(","))
    except ValueError:
        raise ForesightError(f"--edges: expected comma-separated integers, got {args.edges!r}") from None
    twice = next((s for s in args.stages if args.stages.count(s) > 1), None)
    if twice is not None:  # one column per distinct stage: a repeat misaligned the table
        raise ForesightError(f"{twice}: given twice; name each stage once")
    rows = by_length(args.traces, args.gap, args.stages, args.budget, args.interval, edges)
    names = [f"{Path(s.rpartition(':')[0]).parent.name}:{s.rpartition(':')[2]}" for s in args.stages]
    if len(set(names)) < len(names):  # stages of two files in one folder (or folders of one name): one header
        names = list(args.stages)
    print("| tokens | traces | mean length | gap | " + " | ".join(names) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    for r in rows:
        span = f"{r['from']}–{r['to'] - 1}" if r["to"] is not None else f"≥ {r['from']}"
        shares = " | ".join(f"{v:.0%}" for v in r["shares"].values())
        print(f"| {span} | {r['traces']} | {r['mean_len']:.0f} | {r['gap']:.3f} | {shares} |")
    return 0


if __name__ == "__main__":
    run_script(main, "by_length")
