"""The full-cache reference replay in pieces of ``W`` tokens against :data:`foresight.runtime.FULL_PIECE`.

``foresight.replay(model, seqs, "full")`` feeds a policy that neither evicts nor observes in pieces of
``FULL_PIECE`` tokens (nothing happens between pieces); before, it used pieces of ``W`` like an evicting policy.
Both run on the same traces, interleaved repetition by repetition so that machine noise hits both alike; prints
the seconds of each, their ratio and the largest difference of their per-token CE (float rounding only).

    python benchmarks/bench_replay.py --traces runs/quality/heldout_traces --limit 4 --interval 16
    python benchmarks/bench_replay.py --traces runs/quality/heldout_traces --length 1024   # their first 1024 tokens
    python benchmarks/bench_replay.py --length 512          # random tokens when there are no traces

``--length N`` is the length of every sequence replayed: N random tokens, or the first N tokens (prompt included)
of each trace, a shorter trace being refused; without it, 512 random tokens or the traces whole. The JSON output
records it (``length``: null for whole traces).
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


DEFAULT_RANDOM_LENGTH = 512


def _traces(args) -> list[list[int]] | None:
    """The first ``--limit`` traces of ``--traces`` (None without it), cut to their first ``--length`` tokens where
    given (a shorter trace is refused: it would be replayed at another length than the one recorded), read before
    the model is loaded."""
    if args.traces:
        rows = sorted(load_traces(args.traces), key=lambda r: r["trace_id"])[: args.limit]
        if not rows:
            raise ForesightError(f"--traces {args.traces}: no finished trace")
        seqs = [list(map(int, r["input_ids"])) for r in rows]
        if args.length is not None:
            short = [(r["trace_id"], len(s)) for r, s in zip(rows, seqs) if len(s) < args.length]
            if short:
                tid, n = short[0]
                raise ForesightError(f"--length {args.length}: trace {tid!r} of --traces {args.traces} has only {n} "
                                     f"tokens ({len(short)} of the {len(rows)} traces are shorter); pass --length "
                                     f"{min(len(s) for s in seqs)} or less, or no --length to replay them whole")
            seqs = [s[: args.length] for s in seqs]
        return seqs
    return None


def _random(args, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(vocab, (args.length,), generator=gen).tolist() for _ in range(args.limit)]


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--traces", default=None, help="a `foresight trace` directory (default: random tokens)")
    ap.add_argument("--limit", type=positive_int, default=4, help="traces (or random sequences) replayed")
    ap.add_argument("--length", type=positive_int, default=None,
                    help=f"tokens per sequence: of the random ones (default {DEFAULT_RANDOM_LENGTH}), or the first N "
                         "of each trace (default: whole traces)")
    ap.add_argument("--interval", type=positive_int, default=16, help="W: the piece the reference used before")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    check_output_file(args.json, "--json")  # written after the whole benchmark

    seqs = _traces(args)
    if seqs is None and args.length is None:
        args.length = DEFAULT_RANDOM_LENGTH
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
    shape = f"{args.length} tokens each" if args.length is not None else "whole traces"
    print(f"{len(seqs)} sequences ({shape}), {tokens} tokens, median of {args.repeats}: {a} {ta:.2f}s, {b} {tb:.2f}s, "
          f"ratio {ta / tb:.2f}x; max |CE difference| {diff:.2e} nats")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "traces": args.traces, "sequences": len(seqs), "length": args.length,
                       "tokens": tokens, "interval": args.interval,
                       "full_piece": FULL_PIECE, "seconds": {a: ta, b: tb}, "ratio": ta / tb,
                       "max_ce_difference": diff, "torch_threads": torch.get_num_threads()}, fh, indent=1)
    return 0


if __name__ == "__main__":
    run_script(main, "bench_replay")
