#!/usr/bin/env bash
# The untouched split, scored once per release: 32 MATH-style problems written for it (problems.jsonl), never used
# to choose anything. One command from nothing to the headline table (about 1 h on 2 CPU cores; resumable: rerun
# the same command after a stop):
#
#   bash benchmarks/untouched/run.sh            # -> benchmarks/current/untouched/quality_B64_W16, quality_B128_W32
#
# Stages: traces of the default model (T=0.6, at most 512 new tokens, seed 0) -> golden labels at each shipped
# scorer's (B, W) -> the quality benchmark (every heuristic, golden, the shipped scorer) on those traces.
# Intermediate files go to $E (default runs/untouched); only the quality records are written to the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
E=${E:-runs/untouched}
OUT=${OUT:-benchmarks/current/untouched}
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() {  # a sharded foresight job as two single-threaded ranks (faster than one two-threaded process here)
    RANK=0 WORLD_SIZE=2 "$@" & local p0=$!
    RANK=1 WORLD_SIZE=2 "$@" & local p1=$!
    wait $p0 && wait $p1
}
stamp traces
two_ranks $PY -m foresight trace --model smollm2-135m --data benchmarks/untouched/problems.jsonl \
    --max-new-tokens 512 --batch-size 8 --seed 0 --out $E/traces --no-progress
for BW in 64:16 128:32; do
    B=${BW%:*}; W=${BW#*:}
    stamp "golden labels B=$B W=$W"
    two_ranks $PY -m foresight golden --traces $E/traces --out $E/golden_B${B}_W${W} --budget $B --interval $W \
        --no-progress
    stamp "quality B=$B W=$W"
    OMP_NUM_THREADS=2 $PY benchmarks/quality/run.py --model smollm2-135m --traces $E/traces \
        --setting $B:$W=$E/golden_B${B}_W${W} --scorer learned=smollm2-135m-b${B}-w${W} \
        --out $OUT/quality_B${B}_W${W}
done
stamp done
