"""Recompute a quality-benchmark run's summaries from its per-trace records, without replaying anything.

``run.py`` writes ``quality.json`` with summaries computed by :func:`evaluation.quality.quality_summary` at the
time. When the statistics grow (e.g. the bootstrap interval of the share of the gap closed), older runs are brought
up to date from their unchanged records: the learned stages are the ones their summaries list. Prints the tables;
``--write`` also rewrites the summaries in ``quality.json`` and ``quality.md`` (records and meta untouched).

    python benchmarks/quality/summarise.py runs/quality_B64_recipe336/extra16/quality.json
"""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.quality import check_record_values, quality_markdown, quality_summary
from foresight.config import nonnegative_int
from foresight.errors import ForesightError, OneLineParser, run_script

#: what :func:`evaluation.quality.quality_summary` reads of each record
SUMMARY_KEYS = ("policy", "budget", "interval", "traces", "per_trace_ratio", "loss_ratio", "mean_trace_ratio")


def resummarise(path: Path, seed: int = 0) -> dict:
    """The run's data with its summaries recomputed from its records (same settings and stages, in order)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForesightError(f"{path}: not a readable quality.json ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("summaries", "records")):
        raise ForesightError(f"{path}: not a quality.json (no 'summaries' and 'records')")
    for i, r in enumerate(data["records"]):
        missing = [k for k in SUMMARY_KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise ForesightError(f"{path}: record {i} has no {', '.join(missing)}")
        check_record_values(r, f"{path}: record {i} ({r['policy']!r})")
    if not data["summaries"]:
        raise ForesightError(f"{path}: no summaries to recompute (a quality.json lists one per setting)")
    if not all(isinstance(old, dict) and isinstance(old.get("stages", []), list)
               and all(isinstance(st, dict) and isinstance(st.get("stage"), str) for st in old.get("stages", []))
               for old in data["summaries"]):
        raise ForesightError(f"{path}: a summary is not an object with a list of 'stages' (each with its 'stage' name)")
    summaries = []
    for old in data["summaries"]:
        setting = (old.get("budget"), old.get("interval"))
        records = [r for r in data["records"] if (r.get("budget"), r.get("interval")) == setting]
        stages = [st.get("stage") for st in old.get("stages", [])]
        try:
            summaries.append(quality_summary(records, stages, seed=seed))
        except ForesightError as exc:  # name the file and the setting
            raise ForesightError(f"{path}: B={setting[0]} W={setting[1]}: {exc}") from None
    return {**data, "summaries": summaries}


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("quality_json", type=Path)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed (run.py's default is 0)")
    p.add_argument("--write", action="store_true", help="rewrite the summaries in quality.json and quality.md")
    args = p.parse_args(argv)
    data = resummarise(args.quality_json, args.seed)
    md = quality_markdown(data["summaries"])
    print(md)
    if args.write:
        args.quality_json.write_text(json.dumps(data, indent=1))
        model = (data.get("meta") or {}).get("model", "?")
        (args.quality_json.parent / "quality.md").write_text(f"# Quality benchmark ({model})\n\n" + md)
        print(f"rewrote the summaries of {args.quality_json} and {args.quality_json.parent / 'quality.md'}")
    return 0


if __name__ == "__main__":
    run_script(main, "summarise")
