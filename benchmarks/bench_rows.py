"""Recorded rows of every feature group against rows of the scorer's groups only (:mod:`training.dagger`,
:mod:`training.sl_features`).

``train sl`` records, at every event of a replay, the candidates' features: along the golden trajectory into the
feature cache (``--trajectory golden``, :func:`training.sl_features.collect_events`), and along each DAgger round's
mixture policy into the round's rows (``--trajectory round``, the default: round 1 at beta 0.5,
:func:`training.onpolicy.collect_onpolicy_events`). Holding only the groups of the scorer's feature set skips the other
groups' columns and their computation (the recency state, the query ring, the neighbour and query features). This
script records the same traces both ways, interleaved repetition by repetition, batched by length as ``train sl``
batches them, and prints the seconds, the speed-up, the bytes of the packed rows
(:func:`training.event_files.events_bytes`, what ``train sl`` writes), whether the scorer's columns are bit-identical
and on how many traces the caches at every event are the same:

    python benchmarks/bench_rows.py --traces runs/quality/train_traces --labels runs/quality/golden_train_B64_W16
    python benchmarks/bench_rows.py --trajectory golden --traces runs/quality/train_traces \
        --labels runs/quality/golden_train_B64_W16

``--scorer`` (default: the shipped scorer of the default B/W) acts in the round; its feature set is what is recorded.
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
from training.event_files import events_bytes
from training.onpolicy import collect_onpolicy_events
from training.packed_events import recorded_groups
from training.sl_features import collect_events

from recording_inputs import add_arguments, load_inputs  # benchmarks/recording_inputs.py

KINDS = ("every group", "scorer's groups")
TRAJECTORIES = ("round", "golden")


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, "the scorer acting in the round (its feature set is recorded)")
    ap.add_argument("--trajectory", choices=TRAJECTORIES, default="round",
                    help="round: DAgger round 1's rows (beta 0.5); golden: the feature cache's, along the golden "
                         "trajectory")
    args = ap.parse_args(argv)
    inp = load_inputs(args)
    rows, labels, scorer, model, b, w, dims = (inp.rows, inp.labels, inp.scorer, inp.model, inp.budget, inp.interval,
                                               inp.dims)
    groups = {KINDS[0]: tuple(FEATURE_GROUPS), KINDS[1]: recorded_groups(scorer.config.feature_set)}
    batches = length_batches([len(r["input_ids"]) for r in rows], args.batch_size)

    scorer_cols = {kind: torch.tensor(feature_columns(scorer.config.feature_set, groups[kind], *dims))
                   for kind in KINDS}  # the scorer's columns of each kind of rows

    def run(kind: str) -> dict:
        out = {}
        for batch in batches:
            part = [rows[i] for i in batch]
            seqs, ids = [r["input_ids"] for r in part], [r["trace_id"] for r in part]

            def extractor():
                return FeatureExtractor(window=scorer.config.feature_window, feature_set=groups[kind],
                                        decay=scorer.config.decay)

            if args.trajectory == "golden":
                events = collect_events(model, seqs, ids, labels, extractor, b, w, batch_size=len(part))
            else:
                events = collect_onpolicy_events(model, seqs, ids, labels, scorer, extractor, scorer_cols[kind], b, w,
                                                 1, 0.5, 0, batch_size=len(part))
            out.update({ev.trace_id: ev for ev in events})
        return out

    times = {kind: [] for kind in KINDS}
    outputs = {}
    for _ in range(args.repeats):
        for kind in KINDS:
            t0 = time.perf_counter()
            outputs[kind] = run(kind)
            times[kind].append(time.perf_counter() - t0)
    full, mine = (outputs[kind] for kind in KINDS)

    def scorer_features(kind: str, trace_id: str) -> torch.Tensor:  # the recorded (dense) features' scorer columns
        return outputs[kind][trace_id].features.index_select(-1, scorer_cols[kind])

    same_features = all(full[t].features.shape[:-1] == mine[t].features.shape[:-1] and torch.equal(
        scorer_features(KINDS[0], t), scorer_features(KINDS[1], t)) for t in full)
    same = sum(torch.equal(full[t].positions, mine[t].positions) for t in full if full[t].positions.shape
               == mine[t].positions.shape)
    dtype = torch.float16  # train sl's feature_dtype default
    size = {kind: sum(events_bytes(labels[r["trace_id"]], *dims, dtype, groups[kind]) for r in rows) for kind in KINDS}
    secs = {kind: statistics.median(times[kind]) for kind in KINDS}
    tokens = sum(len(r["input_ids"]) for r in rows)
    what = "the golden trajectory (the feature cache)" if args.trajectory == "golden" else "DAgger round 1"
    print(f"{what}: {args.model}, {len(rows)} traces ({tokens} tokens), B={b} W={w}, batches of {args.batch_size} "
          f"by length, {torch.get_num_threads()} torch thread(s), median of {args.repeats} interleaved repeat(s); "
          "scorer "
          f"feature set {','.join(scorer.config.feature_set)}")
    print("| rows of | groups | recording (s) | rows (MB, fp16) |")
    print("|---|---|---:|---:|")
    for kind in KINDS:
        print(f"| {kind} | {','.join(groups[kind])} | {secs[kind]:.1f} | {size[kind] / 1e6:.0f} |")
    print(f"speed-up {secs[KINDS[0]] / secs[KINDS[1]]:.2f}x, rows {size[KINDS[1]] / size[KINDS[0]]:.2f}x the size; "
          f"the scorer's columns bit-identical: {same_features}; same caches on {same} / {len(full)} traces")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"trajectory": args.trajectory, "model": args.model, "traces": len(rows), "tokens": tokens,
                       "budget": b, "interval": w, "batch_size": args.batch_size, "repeats": args.repeats,
                       "torch_threads": torch.get_num_threads(), "feature_set": list(scorer.config.feature_set),
                       "groups": {k: list(v) for k, v in groups.items()}, "seconds": secs, "rows_bytes": size,
                       "same_features": same_features, "same_caches": same}, fh, indent=1)
    if not same_features:  # the two arms must record the same thing, or the timing compares nothing
        print("bench_rows: the scorer's columns differ between the two kinds of rows", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    run_script(main, "bench_rows")
