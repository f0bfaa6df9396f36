"""The fixed split of the quality benchmark: 64 MATH-500 dev problems held out, never trained on.

``python benchmarks/quality/split.py [OUT_DIR]`` (default ``runs/quality/split``) writes ``heldout.jsonl`` and
``train.jsonl`` (the other 336 problems) for ``foresight trace --data``; the held-out ids are committed in
``heldout_problems.txt`` beside this file, and the script refuses to write a split that differs from them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from foresight.data import load_problems
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_dir

HERE = Path(__file__).resolve().parent
HELDOUT = 64


def split(seed: int = 0) -> tuple[list, list]:
    problems = load_problems("math500")
    ids = sorted(p.id for p in problems)
    random.Random(seed).shuffle(ids)
    held = set(ids[:HELDOUT])
    return [p for p in problems if p.id in held], [p for p in problems if p.id not in held]


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="runs/quality/split", help="directory to write the two JSONL files to")
    out = p.parse_args(argv).out
    check_output_dir(out, "OUT_DIR")  # a file, or a path under one: before anything is computed
    held, train = split()
    committed = (HERE / "heldout_problems.txt").read_text().split()
    if sorted(p.id for p in held) != sorted(committed):
        raise ForesightError("the computed split differs from heldout_problems.txt")
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, rows in (("heldout", held), ("train", train)):
        with open(Path(out) / f"{name}.jsonl", "w") as f:
            for p in rows:
                f.write(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n")
    print(f"wrote {len(held)} held-out and {len(train)} training problems to {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "split")
