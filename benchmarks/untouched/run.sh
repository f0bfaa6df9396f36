#!/usr/bin/env bash
# The untouched split, scored once per release: 32 MATH-style problems written for it (problems.jsonl), never used
# to choose anything. One command from nothing to the records behind the README's headline table (about 1 h on
# 2 CPU cores; resumable: rerun the same command after a stop), then `python benchmarks/report.py` for the tables:
#
#   bash benchmarks/untouched/run.sh            # -> benchmarks/current/untouched/quality_B64_W16, quality_B128_W32
#
# Stages: traces of the default model (T=0.6, at most 512 new tokens, seed 0) -> golden labels at each shipped
# scorer's (B, W) -> the quality benchmark (every heuristic, golden, the shipped scorer) on those traces, the two
# settings side by side as single-threaded processes. Intermediate files go to $E (default runs/untouched); only
# the quality records and measured.json (date and commit) are written to the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
E=${E:-runs/untouched}
OUT=${OUT:-benchmarks/current/untouched}
export OMP_NUM_THREADS=1
COMMIT=$(git rev-parse --short HEAD)  # the code that measures, recorded with the numbers
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() {  # a sharded foresight job as two single-threaded ranks (faster than one two-threaded process here)
    RANK=0 WORLD_SIZE=2 "$@" & local p0=$!
    RANK=1 WORLD_SIZE=2 "$@" & local p1=$!
    wait $p0 && wait $p1
}
stamp traces
two_ranks $PY -m foresight trace --model smollm2-135m --data benchmarks/untouched/problems.jsonl \
    --max-new-tokens 512 --batch-size 8 --seed 0 --out $E/traces --no-progress
for B in 64 128; do
    stamp "golden labels B=$B W=$((B / 4))"
    two_ranks $PY -m foresight golden --traces $E/traces --out $E/golden_B${B}_W$((B / 4)) --budget $B \
        --interval $((B / 4)) --no-progress
done
quality() {  # the quality benchmark at one shipped scorer's setting
    $PY benchmarks/quality/run.py --model smollm2-135m --traces $E/traces --setting $1:$2=$E/golden_B$1_W$2 \
        --scorer learned=smollm2-135m-b$1-w$2 --out $OUT/quality_B$1_W$2 > $E/quality_B$1_W$2.log 2>&1
}
stamp "quality B=64 W=16 and B=128 W=32"
quality 64 16 & q64=$!
quality 128 32 & q128=$!
wait $q64 && wait $q128
printf '{"date": "%s", "commit": "%s"}\n' "$(date -u +%F)" "$COMMIT" > $OUT/measured.json
stamp done
