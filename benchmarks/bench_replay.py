"""Evicting replay, layer-major against piecewise, against the one-piece full-cache replay.

For every policy of ``--policies`` the same sequences are replayed under B/W by both engines of
:func:`foresight.replay` (``engine="layer-major"``: each layer's projections and MLP over a span of pieces, its
attention piece by piece; ``engine="piecewise"``: one forward per piece), and once with the full cache in one piece
(:data:`foresight.runtime.FULL_PIECE` tokens), the cost every evicting replay is measured against. All sides run
interleaved, repetition by repetition, so that machine noise hits them alike; prints each side's median seconds,
its ratio to the full replay, and per policy the largest difference of the two engines' per-token CE and whether
their cache statistics (events, evicted entries, peaks) agree.

    python benchmarks/bench_replay.py --length 460 --limit 1 --policies h2o,learned --budget 64 --interval 16
    python benchmarks/bench_replay.py --traces runs/quality/heldout_traces --limit 4 --length 1024
    python benchmarks/bench_replay.py --length 460 --limit 1 --policies h2o,learned --compiled   # + compiled events

``--compiled [BACKEND]`` adds, for every policy that can compile its events (``learned``: ``compile=BACKEND``, default
inductor), the same policy with compiled events, both engines; each such side runs once before the timed repeats (its
compilation, reported as ``warmup_seconds``), and its per-token CE is compared with the eager events'
(``compiled_vs_eager``).

``--length N`` is the length of every sequence replayed: N random tokens, or the first N tokens (prompt included)
of each trace, a shorter trace being refused; without it, 512 random tokens or the traces whole. The JSON output
records it (``length``: null for whole traces). ``learned`` uses ``--scorer`` (default the shipped scorer for the
default B/W).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import fields

import torch

import foresight
from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_file
from foresight.policies import checked_policy
from foresight.policies.registry import check_policy_names
from foresight.runtime import FULL_PIECE
from foresight.schedule import cache_config_arg
from golden.traces import load_traces


DEFAULT_RANDOM_LENGTH = 512
ENGINES = ("layer-major", "piecewise")


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


def _policies(args) -> dict:
    """``--policies`` built and checked against ``--budget``/``--interval`` before the model loads."""
    cfg = cache_config_arg(args.budget, args.interval)
    out = {}
    for name in check_policy_names(args.policies, "--policies"):
        kwargs = {"scorer": args.scorer} if name == "learned" else {}
        policy = checked_policy(name, [(cfg.budget, cfg.interval)], f"--policies {name}", **kwargs)
        if not policy.evicts:
            raise ForesightError(f"--policies {name}: it never evicts; the full-cache replay is the reference already")
        out[name] = policy
        if args.compiled and "compile" in {f.name for f in fields(policy)}:
            out[f"{name} compiled"] = checked_policy(name, [(cfg.budget, cfg.interval)], f"--policies {name}",
                                                     compile=args.compiled, **kwargs)
    return out


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--traces", default=None, help="a `foresight trace` directory (default: random tokens)")
    ap.add_argument("--limit", type=positive_int, default=4, help="traces (or random sequences) replayed")
    ap.add_argument("--length", type=positive_int, default=None,
                    help=f"tokens per sequence: of the random ones (default {DEFAULT_RANDOM_LENGTH}), or the first N "
                         "of each trace (default: whole traces)")
    ap.add_argument("--policies", default="h2o,learned", help="comma-separated evicting policies (default h2o,learned)")
    ap.add_argument("--budget", type=positive_int, default=64)
    ap.add_argument("--interval", type=positive_int, default=16)
    ap.add_argument("--scorer", default="smollm2-135m-b64-w16", help="the learned policy's scorer")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--compiled", nargs="?", const="inductor", default=None, metavar="BACKEND",
                    help="also time the policies that can compile their events with compiled events (torch.compile "
                         "backend, default inductor)")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    check_output_file(args.json, "--json")  # written after the whole benchmark
    policies = _policies(args)
    if args.threads:
        torch.set_num_threads(args.threads)

    seqs = _traces(args)
    if seqs is None and args.length is None:
        args.length = DEFAULT_RANDOM_LENGTH
    model, _ = foresight.load_model(args.model)
    seqs = seqs or _random(args, model.config.vocab_size)

    def full():
        return [foresight.replay(model, [s], "full", interval=args.interval) for s in seqs]

    sides = {"full (one piece)": full}
    for name, policy in policies.items():
        for engine in ENGINES:
            sides[f"{name} {engine}"] = (lambda p=policy, e=engine: [
                foresight.replay(model, [s], p, args.budget, args.interval, engine=e) for s in seqs])
    times: dict[str, list[float]] = {k: [] for k in sides}
    results: dict[str, list] = {}
    foresight.replay(model, seqs[:1], "full", interval=args.interval)  # warm-up
    warmup = {}
    for side, run in sides.items():  # compiled events compile at their first events: once, before the timing
        if " compiled " in side:
            t0 = time.perf_counter()
            run()
            warmup[side] = time.perf_counter() - t0
    for _ in range(args.repeats):
        for side, run in sides.items():
            t0 = time.perf_counter()
            results[side] = run()
            times[side].append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in times.items()}
    ref = median["full (one piece)"]
    agree = {}
    for name in policies:
        a, b = (results[f"{name} {e}"] for e in ENGINES)
        diff = max(float((x.ce - y.ce).abs().nan_to_num().max()) for x, y in zip(a, b))
        agree[name] = {"max_ce_difference": diff, "same_stats": all(x.stats == y.stats for x, y in zip(a, b)),
                       "engines": sorted({x.engine for x in a} | {y.engine for y in b})}
    compiled_vs_eager = {}
    for name in policies:
        if name.endswith(" compiled"):
            a, b = results[f"{name} layer-major"], results[f"{name.removesuffix(' compiled')} layer-major"]
            compiled_vs_eager[name] = {
                "max_ce_difference": max(float((x.ce - y.ce).abs().nan_to_num().max()) for x, y in zip(a, b)),
                "same_stats": all(x.stats == y.stats for x, y in zip(a, b))}
    tokens = sum(len(s) for s in seqs)
    shape = f"{args.length} tokens each" if args.length is not None else "whole traces"
    print(f"{len(seqs)} sequence(s) ({shape}), {tokens} tokens, B={args.budget} W={args.interval}, median of "
          f"{args.repeats} interleaved repeats, {torch.get_num_threads()} torch threads")
    print(f"{'side':<30}{'seconds':>9}{'x full':>8}")
    for side, t in median.items():
        print(f"{side:<30}{t:>9.2f}{t / ref:>8.2f}")
    for name, a in agree.items():
        print(f"{name}: layer-major vs piecewise max |CE difference| {a['max_ce_difference']:.2e} nats, "
              f"cache statistics {'identical' if a['same_stats'] else 'DIFFER'}")
    for name, a in compiled_vs_eager.items():
        print(f"{name} vs eager events (layer-major): max |CE difference| {a['max_ce_difference']:.2e} nats, cache "
              f"statistics {'identical' if a['same_stats'] else 'DIFFER'}; compiling took "
              f"{warmup[name + ' layer-major']:.1f} s (layer-major) + {warmup[name + ' piecewise']:.1f} s (piecewise)"
              " before the timed repeats")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "traces": args.traces, "sequences": len(seqs), "length": args.length,
                       "tokens": tokens, "budget": args.budget, "interval": args.interval, "full_piece": FULL_PIECE,
                       "scorer": args.scorer if "learned" in policies else None, "repeats": args.repeats,
                       "seconds": median, "ratio_to_full": {k: v / ref for k, v in median.items()},
                       "agreement": agree, "compiled_vs_eager": compiled_vs_eager, "warmup_seconds": warmup,
                       "torch_threads": torch.get_num_threads()}, fh, indent=1)
    return 0


if __name__ == "__main__":
    run_script(main, "bench_replay")
