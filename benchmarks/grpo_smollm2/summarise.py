"""Summary of compare.json: mean rewards, top-k and sampled loss ratios, per-trace wins, per-trace table.

Usage: python benchmarks/grpo_smollm2/summarise.py [--exp DIR]   (reads DIR/compare.json, written by compare.py
for two scorers; --exp defaults to $E, else runs/exp7)
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from foresight.config import read_json
from foresight.errors import ForesightError, OneLineParser, run_script

SEEDS = (12345, 777)
KEYS = ("r_topk", "ce_topk", "ce_full", *(f"{k}_{s}" for s in SEEDS for k in ("r_sample", "lr_sample")))


def load_rows(path: Path) -> dict[str, dict[str, dict]]:
    """``{scorer: {trace: row}}`` of a compare.json: two scorers, each on the same traces once, every number
    finite (a pooled or paired number over different traces would be wrong)."""
    rows = read_json(path, "compare file", expect=list)
    by: dict[str, dict[str, dict]] = {}
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not isinstance(r.get("scorer"), str) or not isinstance(r.get("trace"), str):
            raise ForesightError(f"{path}: row {i} is not a compare.py record (needs `scorer` and `trace`)")
        bad = [k for k in KEYS if not isinstance(r.get(k), (int, float)) or not math.isfinite(r[k])]
        if bad:
            raise ForesightError(f"{path}: row {i} ({r['scorer']}, {r['trace']}) has no finite {bad[0]}")
        if r["trace"] in by.setdefault(r["scorer"], {}):
            raise ForesightError(f"{path}: trace {r['trace']!r} appears twice for scorer {r['scorer']!r}")
        by[r["scorer"]][r["trace"]] = r
    if len(by) != 2:
        raise ForesightError(f"{path}: {len(by)} scorer(s) ({', '.join(by) or 'none'}); the summary pairs two")
    (a, ta), (b, tb) = ((n, set(t)) for n, t in by.items())
    if ta != tb:
        only = sorted(ta ^ tb)[0]
        raise ForesightError(f"{path}: scorers {a} and {b} were run on different traces (e.g. {only!r} in one "
                             "only); rerun compare.py")
    if any(by[n][t]["ce_full"] <= 0 for n in by for t in ta):
        raise ForesightError(f"{path}: a full-cache cross-entropy <= 0; rerun compare.py")
    return by


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exp", default=os.environ.get("E", "runs/exp7"), help="run.sh output directory (default $E)")
    args = p.parse_args(argv)
    by = load_rows(Path(args.exp) / "compare.json")
    names = list(by)
    traces = sorted(by[names[0]])
    for n in names:
        d = by[n]
        m = lambda k: sum(d[t][k] for t in traces) / len(traces)  # noqa: E731
        ce_full = sum(d[t]["ce_full"] for t in traces)
        print(f"{n:8s} r_sample(12345) {m('r_sample_12345'):.4f} r_sample(777) {m('r_sample_777'):.4f} "
              f"r_topk {m('r_topk'):.4f} loss ratio topk {sum(d[t]['ce_topk'] for t in traces) / ce_full:.4f}")
    a, b = names
    for k in ("r_sample_12345", "r_sample_777", "r_topk"):
        diffs = [by[b][t][k] - by[a][t][k] for t in traces]
        wins, losses = sum(x > 0 for x in diffs), sum(x < 0 for x in diffs)
        print(f"{k}: {b} - {a} mean {sum(diffs) / len(diffs):+.4f}; {b} better on {wins}/{len(traces)}, "
              f"worse on {losses}")
    for t in traces:
        print(t[:34].ljust(34), " ".join(f"{by[n][t]['r_sample_12345']:+.4f}/{by[n][t]['r_sample_777']:+.4f}/"
                                         f"{by[n][t]['r_topk']:+.4f}" for n in names))
    for n in names:  # the sampled policy's loss ratio, pooled over traces (each trace's ratio is already pooled over G)
        f = sum(by[n][t]["ce_full"] for t in traces)
        print(n, "sampled loss ratio", *(f"seed {s}: "
                                         f"{sum(by[n][t][f'lr_sample_{s}'] * by[n][t]['ce_full'] for t in traces) / f:.4f}"
                                         for s in SEEDS))
    return 0


if __name__ == "__main__":
    run_script(main, "summarise")
