"""Write one scorer that scores the mean of several: an ensemble that every tool takes as it takes any scorer
directory (:func:`foresight.scorer_average.average_scorers`).

    python benchmarks/average_scorers.py --out runs/avg_b64 smollm2-135m-b64-w16 \
        runs/quality_B64/sl_long_scorer

Members are scorer directories or shipped short names; they must share the model, B, W, the feature set and the
decay (one line, exit 2, otherwise). Members that record different ``selection=sample`` temperatures (or one
beside none) are refused, naming each one's, unless ``--temperature T`` chooses the ensemble's; equal ones are
kept. The output records its members, their weights' SHA-256 and their temperatures as provenance.
"""

from __future__ import annotations

from pathlib import Path

from foresight.config import positive_float
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_dir
from foresight.scorer import Scorer, scorer_sha256
from foresight.scorer_average import average_scorers


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("members", nargs="+", help="scorer directories or shipped names (two or more)")
    ap.add_argument("--out", required=True, help="directory to write the averaged scorer to (must not exist)")
    ap.add_argument("--temperature", type=positive_float, default=None,
                    help="the ensemble's selection=sample temperature (required when the members record different "
                         "ones; default: the one they share)")
    args = ap.parse_args(argv)
    if len(args.members) < 2:
        raise ForesightError("give two or more scorers to average")
    out = Path(args.out)
    if out.exists():
        raise ForesightError(f"--out {out} exists; choose a new directory")
    check_output_dir(out, "--out")  # a parent that is a file: a traceback after the members were read
    scorers = [Scorer.from_pretrained(m) for m in args.members]  # each checked (files, finite weights)
    provenance = {"average_of": [{"scorer": m, "sha256": scorer_sha256(m), "temperature": s.config.temperature}
                                 for m, s in zip(args.members, scorers)]}
    if args.temperature is not None:
        provenance["temperature_chosen"] = "--temperature"
    avg = average_scorers(scorers, provenance=provenance, temperature=args.temperature, fix="pass --temperature T")
    avg.save_pretrained(out)
    print(f"wrote the mean of {len(scorers)} scorers (hidden {avg.config.hidden}, B={avg.config.budget}, "
          f"W={avg.config.interval}, temperature {avg.config.temperature}) to {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "average_scorers")
