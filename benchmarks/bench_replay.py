"""The full-cache reference replay in pieces of ``W`` tokens against :data:`foresight.runtime.FULL_PIECE`.

``foresight.replay(model, seqs, "full")`` feeds a policy that neither evicts nor observes in pieces of
``FULL_PIECE`` tokens (nothing happens between pieces); before, it used pieces of ``W`` like an evicting policy.
Both run on the same traces, interleaved repetition by repetition so that machine noise hits both alike; prints
the seconds of each, their ratio and the largest difference of their per-token CE (float rounding only).

    python benchmarks/bench_replay.py --traces runs/quality/heldout_traces --limit 4 --interval 16
    python benchmarks/bench_replay.py --length 512          # random tokens when there are no traces
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import foresight
from foresight.config import check_output_file, positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.runtime import FULL_PIECE
from golden.traces import load_traces


def _traces(args) -> list[list[int]] | None:
    """The first ``--limit`` traces of ``--traces`` (None without it), read before the model is loaded."""
    if args.traces:
        rows = sorted(load_traces(args.traces), key=lambda r: r["trace_id"])[: args.limit]
        if not rows:
            raise ForesightError(f"--traces {args.traces}: no finished trace")
        return [list(map(int, r["input_ids"])) for r in rows]
    return None


def _random(args, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(vocab, (args.length,), generator=gen).tolist() for _ in range(args.limit)]


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--traces", default=None, help="a `foresight trace` directory (default: random tokens)")
    ap.add_argument("--limit", type=positive_int, default=4, help="traces (or random sequences) replayed")
    ap.add_argument("--length", type=positive_int, default=512, help="length of the random sequences")
    ap.add_argument("--interval", type=positive_int, default=16, help="W: the piece the reference used before")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    check_output_file(args.json, "--json")  # written after the whole benchmark

    seqs = _traces(args)
    model, _ = foresight.load_model(args.model)
    seqs = seqs or _random(args, model.config.vocab_size)
    sides = {f"W={args.interval} pieces": args.interval, f"FULL_PIECE={FULL_PIECE}": None}
    times: dict[str, list[float]] = {k: [] for k in sides}
    ce: dict[str, list[torch.Tensor]] = {}
    foresight.replay(model, seqs[:1], "full", interval=args.interval)  # warm-up
    for _ in range(args.repeats):
        for name, chunk in sides.items():
            t0 = time.perf_counter()
            ce[name] = [foresight.replay(model, [s], "full", interval=args.interval, chunk=chunk).ce[0] for s in seqs]
            times[name].append(time.perf_counter() - t0)
    (a, ta), (b, tb) = ((k, statistics.median(v)) for k, v in times.items())
    diff = max(float((x - y).abs().max()) for x, y in zip(ce[a], ce[b]))
    tokens = sum(len(s) for s in seqs)
    print(f"{len(seqs)} sequences, {tokens} tokens, median of {args.repeats}: {a} {ta:.2f}s, {b} {tb:.2f}s, "
          f"ratio {ta / tb:.2f}x; max |CE difference| {diff:.2e} nats")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "sequences": len(seqs), "tokens": tokens, "interval": args.interval,
                       "full_piece": FULL_PIECE, "seconds": {a: ta, b: tb}, "ratio": ta / tb,
                       "max_ce_difference": diff, "torch_threads": torch.get_num_threads()}, fh, indent=1)
    return 0


if __name__ == "__main__":
    run_script(main, "bench_replay")
