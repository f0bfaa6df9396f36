"""Wall time of ``python -m foresight --help`` in this tree against another commit's, interleaved.

The other commit's packages are extracted with ``git archive`` into a temporary directory and run with this
environment's Python (the working directory comes first on ``sys.path`` under ``-m``); the two are timed in turns,
``--runs`` times each, and the medians printed. Timings on a shared machine are ratios at best.

    python benchmarks/cli_help_time.py --ref c92cd94 --runs 5
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from foresight.errors import OneLineParser

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["foresight", "golden", "training", "evaluation"]


def _time(cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "foresight", "--help"], cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="the commit to compare with")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.ref, *PACKAGES], cwd=REPO, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        times = {"this tree": [], args.ref: []}
        for _ in range(args.runs):
            times["this tree"].append(_time(REPO))
            times[args.ref].append(_time(Path(tmp)))
    for name, t in times.items():
        print(f"{name:>12}: median {statistics.median(t):.2f} s over {len(t)} runs ({', '.join(f'{x:.2f}' for x in t)})")
    print(f"ratio: {statistics.median(times[args.ref]) / statistics.median(times['this tree']):.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
