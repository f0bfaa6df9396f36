"""Paired comparison of two learned stages measured in two quality-benchmark runs on the same held-out traces.

``run.py`` pairs the stages of one run; this pairs a stage of one ``quality.json`` with a stage (or policy) of
another, e.g. a newly trained scorer against the shipped one, so a rerun of the old stage is not needed. The two
records must come from the same model, setting (B, W) and traces, with the same full-cache cross-entropy (the
full cache does not depend on the policy, so a different value means different tokens or weights): anything else
is refused, because a paired difference over different traces is a wrong number.

    python benchmarks/quality/compare.py runs/quality/quality_B64_W16/quality.json:sl \
        benchmarks/results/quality_B64/quality.json:sl_long --budget 64 --interval 16
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from evaluation.quality import paired_difference
from foresight.errors import ForesightError, run_script

RECORD_KEYS = ("per_trace_ratio", "tokens", "ce_full", "loss_ratio", "mean_trace_ratio")


def load_record(spec: str, budget: int, interval: int) -> tuple[dict, dict]:
    """``FILE:STAGE`` -> (the run's meta, the stage's fidelity record at (budget, interval))."""
    path, sep, stage = spec.rpartition(":")
    if not sep or not path or not stage:
        raise ForesightError(f"{spec!r}: expected FILE:STAGE, e.g. runs/q/quality.json:sl")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ForesightError(f"{path}: not a readable quality.json ({exc})") from None
    if (not isinstance(data, dict) or not isinstance(data.get("meta"), dict)
            or not isinstance(data.get("records"), list) or not all(isinstance(r, dict) for r in data["records"])):
        raise ForesightError(f"{path}: not a quality.json (no 'meta' and 'records')")
    found = [r for r in data["records"] if r.get("policy") == stage
             and (r.get("budget"), r.get("interval")) == (budget, interval)]
    if not found:
        names = sorted(str(r.get("policy")) for r in data["records"])
        raise ForesightError(f"{path}: no record {stage!r} at B={budget} W={interval} (has {', '.join(names)})")
    missing = [k for k in RECORD_KEYS if k not in found[0]]
    if missing:
        raise ForesightError(f"{path}: record {stage!r} has no {', '.join(missing)}")
    return data["meta"], found[0]


def compare(a_spec: str, b_spec: str, budget: int, interval: int, seed: int = 0) -> dict:
    """The paired per-trace difference a - b of two stages' loss ratios, after checking they belong together."""
    (meta_a, a), (meta_b, b) = load_record(a_spec, budget, interval), load_record(b_spec, budget, interval)
    if meta_a.get("model") != meta_b.get("model"):
        raise ForesightError(f"model differs: {meta_a.get('model')!r} vs {meta_b.get('model')!r}")
    if a["tokens"] != b["tokens"] or not math.isclose(a["ce_full"], b["ce_full"], rel_tol=1e-6):
        raise ForesightError(f"{a_spec} and {b_spec}: different scored tokens or full-cache CE "
                             f"({a['tokens']} vs {b['tokens']} tokens, {a['ce_full']:.6f} vs {b['ce_full']:.6f}); "
                             "not the same traces or model")
    out = paired_difference(a, b, a_spec, b_spec, seed)  # refuses different trace ids
    out.update(a=a_spec, b=b_spec, a_loss_ratio=a["loss_ratio"], b_loss_ratio=b["loss_ratio"],
               a_mean_trace_ratio=a["mean_trace_ratio"], b_mean_trace_ratio=b["mean_trace_ratio"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="FILE:STAGE (quality.json and a stage or policy name in it)")
    p.add_argument("b", help="FILE:STAGE to subtract")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--interval", type=int, required=True)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = p.parse_args(argv)
    r = compare(args.a, args.b, args.budget, args.interval, args.seed)
    print(f"pooled {r['a_loss_ratio']:.4f} vs {r['b_loss_ratio']:.4f}; mean per trace {r['a_mean_trace_ratio']:.4f} "
          f"vs {r['b_mean_trace_ratio']:.4f}; paired a - b {r['mean']:+.4f} [{r['ci_low']:+.4f}, "
          f"{r['ci_high']:+.4f}] over {r['n_traces']} traces")
    return 0


if __name__ == "__main__":
    run_script(main, "compare")
