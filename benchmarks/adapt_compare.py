"""Paired comparison of two adapters measured by `adapt_eval.py` on the same held-out traces.

`adapt_eval.py` pairs one adapter against its base model; this pairs two adapters per trace (a longer run against
a shorter one, one learning rate against another), so which change helped held out comes with an interval instead
of two pooled numbers. It prints each adapter's loss ratio, the share of the gap to 1.0 it removed, its full-cache
CE ratio and its loss ratio against the *base* model's full cache, then the paired per-trace difference A - B with
a bootstrap 95% interval (:func:`evaluation.adapted.compare_adapters`).

The two measurements must come from the same model, traces, policy (hyperparameters and scorer), budget and
interval, and their base records (adapter disabled) must agree; anything else is refused with one line and exit 2,
because a paired difference over different inputs is a wrong number. ``--systems`` compares two systems whose
scorers differ on the base side too (an adapter trained under another scorer): the same model and traces are
still checked, and the two bases are paired as well.

    python benchmarks/adapt_compare.py runs/adapt_B64_W16_s18/eval_B64.json \\
        runs/adapt_B64_W16_s17/eval_B64.json --policy learned --json runs/s18_vs_s17.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evaluation.adapted import compare_adapters
from evaluation.quality import check_record_values
from foresight.config import nonnegative_int, read_json
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_file

#: What each record of an ``adapt_eval.py`` output needs for the comparison.
RECORD_KEYS = ("policy", "loss_ratio", "ce_full", "tokens", "per_trace_ratio")


def load_eval(path: str | Path) -> dict:
    """An ``adapt_eval.py`` JSON output, its structure checked (every error names the file)."""
    data = read_json(path, "adapt_eval output")
    if not isinstance(data.get("meta"), dict) or not all(isinstance(data.get(k), list) for k in ("base", "adapted")):
        raise ForesightError(f"{path}: not an adapt_eval.py output (needs 'meta', 'base' and 'adapted')")
    for kind in ("base", "adapted"):
        for rec in data[kind]:
            missing = [k for k in RECORD_KEYS if not isinstance(rec, dict) or k not in rec]
            if missing:
                raise ForesightError(f"{path}: a {kind} record has no {', '.join(missing)}")
            check_record_values(rec, f"{path}: {kind} record {rec['policy']!r}")
        policies = [rec["policy"] for rec in data[kind]]
        twice = sorted({p for p in policies if policies.count(p) > 1}, key=str)
        if twice:  # e.g. two runs merged by hand: which one a comparison used would be a guess
            raise ForesightError(f"{path}: {policies.count(twice[0])} {kind} records {twice[0]!r}; "
                                 "keep one")
    return data


def markdown(res: dict) -> str:
    lines = [f"A = {res['a']}", f"B = {res['b']}", "",
             f"Policy {res['policy']} at B={res['budget']} W={res['interval']}, "
             f"{res['paired']['n_traces']} traces.", "",
             "| adapter | base | adapted | gap removed | full-cache CE | vs base full cache (gap removed) |",
             "|---|---:|---:|---:|---:|---:|"]
    for side in ("a", "b"):
        s = res[f"{side}_summary"]
        lines.append(f"| {side.upper()} | {s['loss_ratio_base']:.4f} | {s['loss_ratio_adapted']:.4f} | "
                     f"{100 * s['gap_removed']:.1f}% | x{s['full_ce_ratio']:.4f} | {s['vs_base_full_cache']:.4f} "
                     f"({100 * s['gap_removed_vs_base_full_cache']:.1f}%) |")
    if "base_paired" in res:  # --systems
        d = res["base_paired"]
        lines += ["", f"Two systems: the base models evict with A's {res['a_base_scorer']} and B's "
                      f"{res['b_base_scorer']}, the adapted models with {res['a_adapted_scorer']} and "
                      f"{res['b_adapted_scorer']}. The bases paired per trace, A - B: {d['mean']:+.4f} "
                      f"[{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]."]
    elif res.get("a_adapted_scorer") != res.get("b_adapted_scorer"):
        lines += ["", f"The adapted models evict with different scorers: A with {res['a_adapted_scorer']}, "
                      f"B with {res['b_adapted_scorer']} (the base models both with the same one)."]
    d = res["paired"]
    lines += ["", f"Paired per trace, A - B: {d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}] "
              f"(bootstrap {100 * d['level']:.0f}%); A lower on {res['a_lower']} of {d['n_traces']} traces."]
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="adapt_eval.py JSON of adapter A")
    p.add_argument("b", help="adapt_eval.py JSON of adapter B (subtracted)")
    p.add_argument("--policy", default="learned", help="the policy both were measured under (default learned)")
    p.add_argument("--systems", action="store_true",
                   help="compare two systems (adapter + scorer) whose base sides evict with different scorers too "
                   "(same model and traces still required); the bases are paired as well")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed")
    p.add_argument("--json", default=None, help="also write the result as JSON here")
    p.add_argument("--md", default=None, help="also write the table as Markdown here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_output_file(args.json, "--json")
    check_output_file(args.md, "--md")
    res = compare_adapters(load_eval(args.a), load_eval(args.b), args.policy, args.a, args.b, args.seed,
                           systems=args.systems)
    text = markdown(res)
    print(text, end="")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    run_script(main, "adapt_compare")
