"""Replays that need no predictions, with and without the LM head over every position.

Golden labelling (:func:`golden.oracle.label_trace`) and SL feature extraction
(:func:`training.sl_features.collect_events`; DAgger's recording replays are the same kind) replay a trace for the
evictions and the attention only, so they call :func:`foresight.replay` with ``logits=False``: the LM head runs on
each forward's last position and no per-token CE is computed. This script times both jobs as they run
(``logits=False``) and with the replay forced to compute every position's logits (``logits=True``, the cost before),
interleaved repetition by repetition, and checks that the labels and features are identical:

    python benchmarks/bench_logits.py                                   # 4 x 400 random tokens, B=64, W=16
    python benchmarks/bench_logits.py --traces runs/quality/train_traces --limit 4

The features are recorded along the golden trajectory of labels made once beforehand.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

import torch

import foresight
import foresight.runtime
import golden.oracle
import training.sl_features
from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.features import FEATURE_GROUPS, FeatureExtractor
from foresight.schedule import cache_config_arg
from golden.oracle import label_trace
from golden.traces import load_traces
from training.sl_features import collect_events

JOBS = ("golden labels", "SL features")


@contextmanager
def forced_logits(flag: bool):
    """Run the jobs' replays with ``logits=flag`` whatever they ask for."""
    real = foresight.runtime.replay

    def replay(*args, **kwargs):
        return real(*args, **{**kwargs, "logits": flag})

    saved = golden.oracle.replay, training.sl_features.replay
    golden.oracle.replay = training.sl_features.replay = replay
    try:
        yield
    finally:
        golden.oracle.replay, training.sl_features.replay = saved


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--traces", default=None, help="a `foresight trace` directory (default: random tokens)")
    ap.add_argument("--limit", type=positive_int, default=4, help="traces (or random sequences)")
    ap.add_argument("--length", type=positive_int, default=400, help="tokens of each random sequence")
    ap.add_argument("--budget", type=positive_int, default=64)
    ap.add_argument("--interval", type=positive_int, default=16)
    ap.add_argument("--repeats", type=positive_int, default=2)
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    args = ap.parse_args(argv)
    cfg = cache_config_arg(args.budget, args.interval)
    torch.set_num_threads(args.threads)
    seqs = None
    if args.traces:
        rows = sorted(load_traces(args.traces), key=lambda r: r["trace_id"])[: args.limit]
        if not rows:
            raise ForesightError(f"--traces {args.traces}: no finished trace")
        seqs = [list(map(int, r["input_ids"])) for r in rows]
    model, _ = foresight.load_model(args.model)
    if seqs is None:
        gen = torch.Generator().manual_seed(0)
        vocab = model.get_input_embeddings().num_embeddings
        seqs = [torch.randint(vocab, (args.length,), generator=gen).tolist() for _ in range(args.limit)]
    ids = [f"t{i}" for i in range(len(seqs))]
    b, w = cfg.budget, cfg.interval

    def labels():
        return {t: label_trace(model, torch.tensor([s]), b, w, trace_id=t) for t, s in zip(ids, seqs)}

    fixed = labels()

    def features():
        extractor = lambda: FeatureExtractor(window=w, feature_set=tuple(FEATURE_GROUPS))  # noqa: E731
        return collect_events(model, seqs, ids, fixed, extractor, b, w, batch_size=len(seqs))

    times = {(job, flag): [] for job in JOBS for flag in (True, False)}
    outputs = {}
    for _ in range(args.repeats):
        for flag in (True, False):
            with forced_logits(flag):
                for job, run in zip(JOBS, (labels, features)):
                    t0 = time.perf_counter()
                    outputs[job, flag] = run()
                    times[job, flag].append(time.perf_counter() - t0)
    same_labels = all(
        torch.equal(x.evicted, y.evicted) and torch.equal(x.alpha, y.alpha)
        for t in ids for x, y in zip(outputs["golden labels", True][t].events, outputs["golden labels", False][t].events))
    same_features = all(torch.equal(x.features, y.features) and torch.equal(x.alpha, y.alpha)
                        for x, y in zip(outputs["SL features", True], outputs["SL features", False]))
    print(f"{args.model}, {len(seqs)} {'traces' if args.traces else f'x {args.length} random tokens'}, B={b} W={w}, "
          f"{torch.get_num_threads()} torch thread(s), median of {args.repeats} interleaved repeats")
    print("| job | logits=True (s) | logits=False (s) | speed-up | identical |")
    print("|---|---:|---:|---:|---|")
    for job, same in zip(JOBS, (same_labels, same_features)):
        on, off = statistics.median(times[job, True]), statistics.median(times[job, False])
        print(f"| {job} | {on:.2f} | {off:.2f} | {on / off:.2f}x | {same} |")
    return 0


if __name__ == "__main__":
    run_script(main, "bench_logits")
