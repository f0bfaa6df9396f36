"""The share of the best-heuristic -> golden gap a learned stage closes over several trace sets at once.

Each trace set is a small sample (16 traces, 48, 60 AIME traces) and their shares scatter by more than any change we
test; pooled, they give one estimate of what the stage does beyond its own split, with one interval. Every ``--set``
is ``LEARNED=FILE:STAGE`` (a quality.json or fidelity.json and its stage, as for ``compare.py``) and
``GAP=FILE:HEURISTIC`` (the run holding that heuristic and golden on the same traces), checked as ``compare.py``
checks them. Sets must come from different trace directories (a trace counted twice would weigh double); trace ids
may repeat across them (``#0`` of a problem sampled with another seed is another trace), and traces of one problem
are resampled together wherever they are.

    python benchmarks/quality/pooled_gap.py --budget 64 --interval 16 \\
        --set runs/ensemble_s33/x16_t005/fidelity.json:learned \\
              runs/quality_B64_recipe336/extra16/quality.json:tova \\
        --set ...

Prints each set's pooled share and, over all sets, the pooled share (every token weighs the same: each set's
pooled ratios weighted by its full-cache loss, tokens x CE) and the share on per-trace means with a bootstrap
interval that resamples problems (traces of one problem, in one set or several, are not independent).
"""

from __future__ import annotations

from evaluation.quality import check_comparable, gap_share, load_gap_references, load_record, problem_of
from evaluation.stats import gap_share_bootstrap
from foresight.config import nonnegative_int
from foresight.errors import ForesightError, OneLineParser, run_script


def pooled_gap(sets: list[tuple[str, str]], budget: int, interval: int, seed: int = 0) -> dict:
    """Each set's share and the share over all of them (``pooled``, token-weighted; ``share`` and its interval on
    per-trace means, problems resampled)."""
    if not sets:
        raise ForesightError("no --set given")
    per_set, seen = [], {}  # trace directory -> the set that used it
    stage, worse, better, groups = [], [], [], []
    weight, total = 0.0, {"stage": 0.0, "worse": 0.0, "better": 0.0}
    for learned_spec, gap_spec in sets:
        meta, rec = load_record(learned_spec, budget, interval)
        gmeta, (best_spec, best), (golden_spec, golden) = load_gap_references(gap_spec, budget, interval)
        for spec, other in ((best_spec, best), (golden_spec, golden)):
            check_comparable(meta, rec, gmeta, other, learned_spec, spec)
        where = meta.get("traces")
        if not where:
            raise ForesightError(f"{learned_spec}: its run names no trace directory (meta 'traces'), so it cannot be "
                                 "told from the other sets")
        if where in seen:
            raise ForesightError(f"{learned_spec} and {seen[where]} were both measured on {where}; each trace may "
                                 "count once")
        seen[where] = learned_spec
        share = gap_share(rec, best, golden, (learned_spec, best_spec, golden_spec), seed)
        per_set.append({"set": learned_spec, "traces": len(rec["per_trace_ratio"]), "pooled": share["pooled"]})
        for t in sorted(rec["per_trace_ratio"]):
            stage.append(rec["per_trace_ratio"][t])
            worse.append(best["per_trace_ratio"][t])
            better.append(golden["per_trace_ratio"][t])
            groups.append(problem_of(t))
        w = rec["tokens"] * rec["ce_full"]  # the set's full-cache loss: its pooled ratios' weight
        weight += w
        for key, r in (("stage", rec), ("worse", best), ("better", golden)):
            total[key] += w * r["loss_ratio"]
    pooled = {k: v / weight for k, v in total.items()}
    gap = pooled["worse"] - pooled["better"]
    out = gap_share_bootstrap(stage, worse, better, seed=seed, groups=groups)
    out.update(sets=per_set, pooled=(pooled["worse"] - pooled["stage"]) / gap if gap > 0 else float("nan"),
               loss_ratio=pooled["stage"], heuristic_ratio=pooled["worse"], golden_ratio=pooled["better"])
    return out


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", nargs=2, action="append", metavar=("LEARNED", "GAP"), required=True,
                   help="FILE:STAGE of the learned stage and FILE:HEURISTIC of the run with that heuristic and golden")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--interval", type=int, required=True)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed")
    args = p.parse_args(argv)
    r = pooled_gap([tuple(s) for s in args.set], args.budget, args.interval, args.seed)
    for s in r["sets"]:
        print(f"{s['set']}: {s['traces']} traces, {s['pooled']:.1%} of the gap pooled")
    print(f"all {r['n_traces']} traces ({r['n_groups']} problems): pooled {r['loss_ratio']:.4f} (heuristic "
          f"{r['heuristic_ratio']:.4f}, golden {r['golden_ratio']:.4f}), {r['pooled']:.1%} of the gap; per-trace "
          f"means {r['share']:.1%} [{r['ci_low']:.1%}, {r['ci_high']:.1%}] (problems resampled)")
    return 0


if __name__ == "__main__":
    run_script(main, "pooled_gap")
