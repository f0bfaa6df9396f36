"""Batched replays in trace order against batches of similar lengths (:func:`foresight.runtime.length_batches`).

A batched replay runs every row for its batch's longest trace. SL feature extraction
(:func:`training.sl_features.collect_events`) and a DAgger round's recording
(:func:`training.onpolicy.collect_onpolicy_events`) replay ``--batch-size`` traces together; this script times both
jobs on the same traces batched in trace-id order (contiguous runs, as before) and longest first by length (as they
run now), interleaved repetition by repetition, and prints the padded tokens of each batching, the seconds, the
speed-up, how far the two batchings' features differ (other batch mates change only float rounding) and on how many
traces the caches at every event are the same (a DAgger rollout whose scorer meets a near-tie may take another
trajectory):

    python benchmarks/bench_batching.py --traces runs/quality/train_traces --labels runs/quality/golden_train_B64_W16

The DAgger job records round 1 at beta 0.5 with ``--scorer`` (default: the shipped scorer of the default B/W).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from foresight.errors import OneLineParser, run_script
from foresight.feature_groups import FEATURE_GROUPS, feature_columns
from foresight.features import FeatureExtractor
from foresight.runtime import length_batches
from training.onpolicy import collect_onpolicy_events
from training.sl_features import collect_events

from recording_inputs import add_arguments, load_inputs  # benchmarks/recording_inputs.py

ORDERS = ("trace order", "by length")
JOBS = ("SL features", "DAgger round 1")


def trace_order(n: int, size: int) -> list[list[int]]:
    """Contiguous batches of ``size`` in the given order (the batching before :func:`length_batches`)."""
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, "the scorer of the DAgger round's rollouts")
    args = ap.parse_args(argv)
    inp = load_inputs(args)
    rows, labels, scorer, model, b, w = inp.rows, inp.labels, inp.scorer, inp.model, inp.budget, inp.interval
    columns = torch.tensor(feature_columns(scorer.config.feature_set, tuple(FEATURE_GROUPS), *inp.dims))
    lengths = [len(r["input_ids"]) for r in rows]
    batchings = {"trace order": trace_order(len(rows), args.batch_size),
                 "by length": length_batches(lengths, args.batch_size)}

    def extractor():
        return FeatureExtractor(window=scorer.config.feature_window, feature_set=tuple(FEATURE_GROUPS))

    def run(job: str, order: str) -> dict:
        out = {}
        for batch in batchings[order]:
            part = [rows[i] for i in batch]
            seqs, ids = [r["input_ids"] for r in part], [r["trace_id"] for r in part]
            if job == "SL features":
                events = collect_events(model, seqs, ids, labels, extractor, b, w, batch_size=len(part))
            else:
                events = collect_onpolicy_events(model, seqs, ids, labels, scorer, extractor, columns, b, w, 1, 0.5,
                                                 0, batch_size=len(part))
            out.update({ev.trace_id: ev for ev in events})
        return out

    times = {(job, order): [] for job in JOBS for order in ORDERS}
    outputs = {}
    for _ in range(args.repeats):
        for job in JOBS:
            for order in ORDERS:
                t0 = time.perf_counter()
                outputs[job, order] = run(job, order)
                times[job, order].append(time.perf_counter() - t0)

    def padded(order: str) -> int:
        return sum(max(lengths[i] for i in batch) * len(batch) for batch in batchings[order])

    results = {"model": args.model, "traces": len(rows), "tokens": sum(lengths), "budget": b, "interval": w,
               "batch_size": args.batch_size, "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
               "padded_tokens": {order: padded(order) for order in ORDERS}, "jobs": {}}
    print(f"{args.model}, {len(rows)} traces ({sum(lengths)} tokens), B={b} W={w}, batches of {args.batch_size}, "
          f"{torch.get_num_threads()} torch thread(s), median of {args.repeats} interleaved repeat(s)")
    print("padded tokens: " + ", ".join(f"{o} {padded(o) / sum(lengths):.2f}x the tokens" for o in ORDERS))
    print("| job | trace order (s) | by length (s) | speed-up | max feature difference | same caches |")
    print("|---|---:|---:|---:|---:|---:|")
    for job in JOBS:
        a, z = (outputs[job, order] for order in ORDERS)
        diff = max(float((a[t].features.float() - z[t].features.float()).abs().max())
                   if a[t].features.shape == z[t].features.shape else float("inf") for t in a)
        same = sum(a[t].positions.shape == z[t].positions.shape and torch.equal(a[t].positions, z[t].positions)
                   for t in a)  # the same cache at every event: the same trajectory
        slow, fast = (statistics.median(times[job, order]) for order in ORDERS)
        print(f"| {job} | {slow:.1f} | {fast:.1f} | {slow / fast:.2f}x | {diff:.1e} | {same} / {len(a)} traces |")
        results["jobs"][job] = {"seconds": {o: statistics.median(times[job, o]) for o in ORDERS},
                                "max_feature_difference": diff, "same_caches": same}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    run_script(main, "bench_batching")
