#!/usr/bin/env bash
# The quality recipe on the default model (CPU, 2 cores): traces of the 336 training problems and the 64 held-out
# problems of benchmarks/quality/heldout_problems.txt -> golden labels at B/W -> SL with DAgger rounds -> loss-aware
# refinement (`train e2e`) -> the quality benchmark (every heuristic, golden, SL, SL+DAgger, +e2e) on the held-out
# traces.
# Every stage resumes when rerun (kill it at any point and run the same command again).
#
#   bash benchmarks/quality/recipe.sh                 # B=64, W=16, all 336 training problems: the packaged scorer's
#                                                     # recipe (pre-RoPE keys, SL + three DAgger rounds)
#   B=128 W=32 bash benchmarks/quality/recipe.sh      # the other shipped setting
#   TRAIN=96 bash benchmarks/quality/recipe.sh        # the first 96 training traces only (a quicker run)
#   ROUNDS=4 bash benchmarks/quality/recipe.sh        # after a finished 3-round run: trains round 4 only
#   E2E_STEPS=0 bash benchmarks/quality/recipe.sh     # imitation only (no `train e2e` stage)
#   HELDOUT=48 STAGE=heldout bash benchmarks/quality/recipe.sh   # the benchmark's 48 held-out traces only
#   FEATURES=key,value,attn,age ROUNDS=2 bash benchmarks/quality/recipe.sh   # the post-RoPE-key recipe (post-RoPE
#                                                     # keys; its SL and benchmark directories carry no feature tag)
#
# A DAgger round records packed rows of about 5.7 GB at B=64 (the scorer's feature groups only; `train sl` refuses a
# round that will not fit, before any work). Measured at B=64 with HELDOUT=48 (2-core CPU, each stage alone,
# 2026-12-07): about 1 h 15 min, the sum of its stages, and 1 h 8 min without the e2e stage (E2E_STEPS=0). Held-out
# traces 2.6 min, the 336 training traces 19.1 min (finished traces leave their batch, benchmarks/bench_trace.py),
# golden labels 4.4 min, SL + three DAgger rounds 32.0 min (benchmarks/quality/train_sl.sh: the feature cache of the
# scorer's groups 4.1 min, benchmarks/current/sl_features; round 0 trained in 2.5 min; rounds 1-3 recorded in 4.6 min
# each, replays batched by length, benchmarks/bench_batching.py, rows of the scorer's groups, benchmarks/bench_rows.py;
# trained in 2.7, 3.1 and 4.3 min, the aggregated rows outgrowing the page cache of a 24 GB machine by round 3), train
# e2e about 7.9 min on two ranks (estimated: 13.6 min measured at 6c030f0 as one process, its steps since 1.43x faster
# in alternating runs, 397e06c, and two ranks 1.21x faster than one process, benchmarks/current/e2e_ranks), the
# benchmark 9.4 min on two ranks. Each stage was rerun on its own (commits 92e742a to 6c030f0, the e2e stage then one
# two-threaded process) from the inputs of a full run earlier that day, and reproduced its outputs: the same traces,
# byte-identical labels and scorers, every policy's per-trace CE in the benchmark equal.
# Stages use two single-threaded processes where the work shards (traces, labels, the benchmark): on two cores that is
# faster than one two-threaded process and robust to other load; train sl and train e2e run as two DeepSpeed ranks.
# Outputs under $E (default runs/quality).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
E=${E:-runs/quality}
B=${B:-64}
W=${W:-16}
TRAIN=${TRAIN:-0}        # 0: every finished training trace
HELDOUT=${HELDOUT:-64}
STEPS=${STEPS:-2400}
ROUNDS=${ROUNDS:-3}
E2E_STEPS=${E2E_STEPS:-72}    # train e2e steps after SL + DAgger (0: none), two traces a step (one per rank)
E2E_TRACES=${E2E_TRACES:-96}  # on the first N training traces (4 problems of them held out)
FEATURES=${FEATURES:-prekey,value,attn,age}   # the scorer's feature groups (foresight.feature_groups)
TAG=""; [ "$FEATURES" != key,value,attn,age ] && TAG="_${FEATURES//,/-}"   # no tag: the first recipe's directories
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }

two_ranks() {  # run a sharded foresight job as two single-threaded ranks
    RANK=0 WORLD_SIZE=2 "$@" & local p0=$!
    RANK=1 WORLD_SIZE=2 "$@" & local p1=$!
    wait $p0 && wait $p1
}

stamp split
$PY benchmarks/quality/split.py $E/split
stamp "held-out traces"
two_ranks $PY -m foresight trace --model smollm2-135m --data $E/split/heldout.jsonl --limit $HELDOUT \
    --max-new-tokens 512 --batch-size 24 --seed 0 --out $E/heldout_traces --no-progress
[ "${STAGE:-}" = heldout ] && { stamp "held-out traces done (STAGE=heldout)"; exit 0; }
stamp "training traces"
two_ranks $PY -m foresight trace --model smollm2-135m --data $E/split/train.jsonl \
    --max-new-tokens 512 --batch-size 24 --seed 0 --out $E/train_traces --no-progress
limit=""; [ "$TRAIN" != 0 ] && limit="--limit $TRAIN"
stamp "golden labels B=$B W=$W"
two_ranks $PY -m foresight golden --traces $E/heldout_traces --out $E/golden_heldout_B${B}_W${W} \
    --budget $B --interval $W --no-progress
two_ranks $PY -m foresight golden --traces $E/train_traces --out $E/golden_train_B${B}_W${W} $limit \
    --budget $B --interval $W --no-progress
stamp "SL + $ROUNDS DAgger rounds"
SL=$E/sl_B${B}_W${W}${TAG}
E=$E PY=$PY bash benchmarks/quality/train_sl.sh $B $W $SL steps=$STEPS "feature_set=[$FEATURES]" dagger_rounds=$ROUNDS
if [ "$E2E_STEPS" != 0 ]; then
    stamp "loss-aware refinement: train e2e, $E2E_STEPS steps"
    E2E=$E/e2e_B${B}_W${W}${TAG}
    resume=""; [ -d $E2E/checkpoints ] && resume="--resume"
    # two single-threaded ranks, lr twice configs/e2e.yaml's for the doubled batch: 1.21x faster than one process on
    # two threads, and a better scorer than that process's 144 steps of one trace at lr 1e-4
    # (benchmarks/current/e2e_ranks)
    [ -f $E2E/summary.json ] || DS_ACCELERATOR=cpu $PY -m foresight launch --nproc-per-node 2 \
        --master-port ${PORT_E2E:-29812} train e2e --config configs/e2e.yaml traces=$E/train_traces \
        max_traces=$E2E_TRACES init_scorer=$SL/scorer out_dir=$E2E steps=$E2E_STEPS lr=2.0e-4 heldout=4 eval_traces=4 \
        eval_before=false checkpoint_every=12 device=cpu $resume
fi
stamp "quality benchmark"
if [ "$ROUNDS" = 0 ]; then stages="--scorer sl=$SL/scorer"  # plain SL writes no rounds/
else stages="--scorer sl=$SL/rounds/round-0/scorer --scorer dagger=$SL/scorer"; fi
[ "$E2E_STEPS" != 0 ] && stages="$stages --scorer e2e=$E2E/scorer"
quality=(benchmarks/quality/run.py --model smollm2-135m --traces $E/heldout_traces
    --setting $B:$W=$E/golden_heldout_B${B}_W${W} $stages --out $E/quality_B${B}_W${W}${TAG})
two_ranks $PY "${quality[@]}"  # each rank replays its share of the batches into its journal file
$PY "${quality[@]}"             # every batch journalled: sums them and writes the results
stamp done
