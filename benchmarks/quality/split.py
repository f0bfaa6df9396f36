"""The fixed split of the quality benchmark: 64 MATH-500 dev problems held out, never trained on.

``python benchmarks/quality/split.py OUT_DIR`` writes ``heldout.jsonl`` and ``train.jsonl`` (the other 336
problems) for ``foresight trace --data``; the held-out ids are committed in ``heldout_problems.txt`` beside this
file, and the script refuses to write a split that differs from them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from foresight.data import load_problems
from foresight.errors import ForesightError, run_script

HERE = Path(__file__).resolve().parent
HELDOUT = 64


def split(seed: int = 0) -> tuple[list, list]:
    problems = load_problems("math500")
    ids = sorted(p.id for p in problems)
    random.Random(seed).shuffle(ids)
    held = set(ids[:HELDOUT])
    return [p for p in problems if p.id in held], [p for p in problems if p.id not in held]


def main(out: str) -> int:
    held, train = split()
    committed = (HERE / "heldout_problems.txt").read_text().split()
    if sorted(p.id for p in held) != sorted(committed):
        raise ForesightError("the computed split differs from heldout_problems.txt")
    if Path(out).exists() and not Path(out).is_dir():
        raise ForesightError(f"{out} exists and is not a directory")
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, rows in (("heldout", held), ("train", train)):
        with open(Path(out) / f"{name}.jsonl", "w") as f:
            for p in rows:
                f.write(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n")
    print(f"wrote {len(held)} held-out and {len(train)} training problems to {out}")
    return 0


if __name__ == "__main__":
    run_script(lambda: main(sys.argv[1] if len(sys.argv) > 1 else "runs/quality/split"), "split")
