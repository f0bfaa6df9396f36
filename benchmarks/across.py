"""Every policy of a small-budget fidelity run against the heuristics of a larger-budget run, on the same positions.

The small run is ``foresight eval fidelity --score-from N`` at budget B (N = B' + W', the first position the larger
budget B' scores); the large run is ``foresight eval fidelity`` of the heuristics at B' over the same traces. For each
policy of the small run (``golden``, ``learned``, ...) prints its pooled loss ratio, the best heuristic's at B', their
paired per-trace difference with a bootstrap interval, and the same by trace length in thirds
(:func:`benchmarks.report.compare_across`, the comparison of ``docs/results.md``).

    python benchmarks/across.py runs/ceiling/b64_from160 runs/ceiling/b128 --json runs/ceiling/across.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import across_cells, across_header, compare_across  # noqa: E402

from foresight.errors import ForesightError, OneLineParser, run_script  # noqa: E402
from foresight.output_paths import check_output_file  # noqa: E402


def _records(run: str, flag: str) -> list[dict]:
    path = Path(run) / "fidelity.json"
    try:
        records = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ForesightError(f"{flag} {run}: {path} is not a readable fidelity record ({exc})") from None
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) and "per_trace_ce" in r
                                                               for r in records):
        raise ForesightError(f"{flag} {run}: {path} holds no per-trace fidelity records (foresight eval fidelity "
                             "writes them)")
    return records


def table(results: list[dict]) -> str:
    """The comparisons as markdown: one row per policy, then the thirds by trace length."""
    out = across_header("policy")
    for a in results:
        (b, w), (lb, lw) = a["small"], a["large"]
        out.append(f"| {a['policy']} B={b}/W={w} | B={lb}/W={lw} | {across_cells(a)}")
    out += ["", "| policy at | positions scored per trace | traces | policy, pooled | best heuristic, pooled | "
            "traces policy wins |", "|---|---|---:|---:|---:|---:|"]
    for a in results:
        for g in a["thirds"]:
            out.append(f"| {a['policy']} B={a['small'][0]} | {g['positions'][0]}–{g['positions'][1]} | {g['traces']} "
                       f"| {g['small']:.3f} | {g['large']:.3f} | {g['wins']} / {g['traces']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("small", help="`foresight eval fidelity --score-from N` output at the small budget")
    ap.add_argument("large", help="`foresight eval fidelity` output of the heuristics at the larger budget")
    ap.add_argument("--json", default=None, help="also write the comparisons to this JSON file")
    args = ap.parse_args(argv)
    check_output_file(args.json, "--json")
    small, large = _records(args.small, "small"), _records(args.large, "large")
    results = [compare_across(rec, large, f"small {args.small}", f"large {args.large}",
                              "replay the small budget with --score-from the larger one's B + W on the same traces")
               for rec in small]
    print(table(results), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    run_script(main, "across")
