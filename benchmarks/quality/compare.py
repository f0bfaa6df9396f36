"""Paired comparison of two learned stages measured in two quality-benchmark runs on the same held-out traces.

``run.py`` pairs the stages of one run; this pairs a stage of one ``quality.json`` with a stage (or policy) of
another, e.g. a newly trained scorer against the shipped one, so a rerun of the old stage is not needed. The two
records must come from the same model, setting (B, W) and traces, with the same full-cache cross-entropy (the
full cache does not depend on the policy, so a different value means different tokens or weights): anything else
is refused, because a paired difference over different traces is a wrong number.

    python benchmarks/quality/compare.py runs/quality/quality_B64_W16/quality.json:sl \
        runs/quality_B64/quality.json:sl_long --budget 64 --interval 16

A ``FILE`` may also be a ``foresight eval fidelity`` output's ``fidelity.json`` (``STAGE`` its policy, e.g.
``learned``; the model is read from the ``settings.json`` beside it). ``--gap FILE:HEURISTIC`` adds the share of
that heuristic -> golden gap each side closes (pooled, and on per-trace means with a bootstrap interval), with
golden and the heuristic from one quality benchmark run on the same traces. ``--by-problem`` resamples problems
instead of traces for the intervals (the cluster bootstrap), for trace sets with several samples per problem.
"""

from __future__ import annotations

from evaluation.quality import check_comparable, gap_share, load_gap_references, load_record, paired_difference
from foresight.config import nonnegative_int
from foresight.errors import OneLineParser, run_script


def compare(a_spec: str, b_spec: str, budget: int, interval: int, seed: int = 0, gap: str | None = None,
            by_problem: bool = False) -> dict:
    """The paired per-trace difference a - b of two stages' loss ratios, after checking they belong together;
    with ``gap`` (``FILE:HEURISTIC``) also the share of that heuristic -> golden gap each closes."""
    (meta_a, a), (meta_b, b) = load_record(a_spec, budget, interval), load_record(b_spec, budget, interval)
    check_comparable(meta_a, a, meta_b, b, a_spec, b_spec)
    refs = []
    if gap is not None:
        meta, *refs = load_gap_references(gap, budget, interval)
        for spec, rec in refs:
            check_comparable(meta_a, a, meta, rec, a_spec, spec)
    out = paired_difference(a, b, a_spec, b_spec, seed, by_problem)  # refuses different trace ids
    out.update(a=a_spec, b=b_spec, a_loss_ratio=a["loss_ratio"], b_loss_ratio=b["loss_ratio"],
               a_mean_trace_ratio=a["mean_trace_ratio"], b_mean_trace_ratio=b["mean_trace_ratio"])
    if refs:
        (best_name, best), (golden_name, golden) = refs
        for side, rec, name in (("a", a, a_spec), ("b", b, b_spec)):
            out[f"{side}_gap_closed"] = gap_share(rec, best, golden, (name, best_name, golden_name), seed, by_problem)
    return out


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="FILE:STAGE (quality.json and a stage or policy name in it)")
    p.add_argument("b", help="FILE:STAGE to subtract")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--interval", type=int, required=True)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed")
    p.add_argument("--gap", metavar="FILE:HEURISTIC", default=None,
                   help="a quality.json and its heuristic: report the share of the heuristic -> golden gap closed")
    p.add_argument("--by-problem", action="store_true",
                   help="resample problems, not traces, for the intervals (several traces per problem)")
    args = p.parse_args(argv)
    r = compare(args.a, args.b, args.budget, args.interval, args.seed, args.gap, args.by_problem)
    print(f"pooled {r['a_loss_ratio']:.4f} vs {r['b_loss_ratio']:.4f}; mean per trace {r['a_mean_trace_ratio']:.4f} "
          f"vs {r['b_mean_trace_ratio']:.4f}; paired a - b {r['mean']:+.4f} [{r['ci_low']:+.4f}, "
          f"{r['ci_high']:+.4f}] over {r['n_traces']} traces"
          + (f" of {r['n_groups']} problems (problems resampled)" if "n_groups" in r else ""))
    for side in ("a", "b"):
        if f"{side}_gap_closed" in r:
            g = r[f"{side}_gap_closed"]
            print(f"{side} closes {g['pooled']:.1%} of the {args.gap} -> golden gap pooled, per-trace means "
                  f"{g['share']:.1%} [{g['ci_low']:.1%}, {g['ci_high']:.1%}]")
    return 0


if __name__ == "__main__":
    run_script(main, "compare")
