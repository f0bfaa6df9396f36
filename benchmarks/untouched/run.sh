#!/usr/bin/env bash
# The untouched split, scored once per release: 32 MATH-style problems written for it (problems.jsonl), never used
# to choose anything. One command from nothing to the records behind the README's headline table and
# docs/results.md (about 1 h 30 min on 2 CPU cores), then `python benchmarks/report.py` for the tables and plots:
#
#   bash benchmarks/untouched/run.sh     # -> benchmarks/current/untouched/{quality_B*_W*,across_B*_from*}
#
# Stages: traces of the default model (T=0.6, at most 512 new tokens, seed 0) -> golden labels at each budget
# (B = 32, 64, 128 with W = B/4) -> the quality benchmark (every heuristic, golden, the learned scorer) at each
# budget -> learned and golden replayed once more on the positions a larger budget scores (`--score-from`), so that
# learned at B can be compared with the heuristics at 2B and 4B on the same positions, beside the oracle it
# imitates. B=64 and B=128 use the shipped scorers; B=32 uses the B=64 scorer moved to the smaller cache
# (`foresight export --budget 32 --interval 8`).
#
# A stage whose record exists is skipped, so a stopped run resumes with the same command (the trace, golden and
# quality stages also resume inside themselves). To measure anew, delete benchmarks/current/untouched/. Intermediate
# files go to $E (default runs/untouched); only the records, each with a measured.json (date and commit), are
# written to the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
E=${E:-runs/untouched}
OUT=${OUT:-benchmarks/current/untouched}
export OMP_NUM_THREADS=1
COMMIT=$(git rev-parse --short HEAD)  # the code that measures, recorded with the numbers
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
measured() { printf '{"date": "%s", "commit": "%s"}\n' "$(date -u +%F)" "$COMMIT" > "$1/measured.json"; }
two_ranks() {  # a sharded foresight job as two single-threaded ranks (faster than one two-threaded process here)
    RANK=0 WORLD_SIZE=2 "$@" & local p0=$!
    RANK=1 WORLD_SIZE=2 "$@" & local p1=$!
    wait $p0 && wait $p1
}
scorer() {  # the learned scorer at B=$1, W=$2
    if [ -d foresight/scorers/smollm2-135m-b$1-w$2 ]; then
        echo smollm2-135m-b$1-w$2
    else
        # keyed by the B=64 weights it moves, so that new shipped weights are never measured through an old copy
        local sha moved
        sha=$(sha256sum foresight/scorers/smollm2-135m-b64-w16/model.safetensors | cut -c1-12)
        moved=$E/scorer_B$1_W$2_$sha
        [ -f $moved/config.json ] || $PY -m foresight export foresight/scorers/smollm2-135m-b64-w16 \
            --budget $1 --interval $2 --out $moved >&2
        echo $moved
    fi
}
stamp traces
two_ranks $PY -m foresight trace --model smollm2-135m --data benchmarks/untouched/problems.jsonl \
    --max-new-tokens 512 --batch-size 8 --seed 0 --out $E/traces --no-progress
for B in 32 64 128; do
    stamp "golden labels B=$B W=$((B / 4))"
    two_ranks $PY -m foresight golden --traces $E/traces --out $E/golden_B${B}_W$((B / 4)) --budget $B \
        --interval $((B / 4)) --no-progress
done
quality() {  # the quality benchmark at B=$1, W=$2 (paged's blocks: 16 tokens, or W where W is smaller)
    local dir=$OUT/quality_B$1_W$2
    [ -f $dir/measured.json ] && return 0
    $PY benchmarks/quality/run.py --model smollm2-135m --traces $E/traces --setting $1:$2=$E/golden_B$1_W$2 \
        --scorer learned=$(scorer $1 $2) --policy-arg paged.block_size=$(($2 < 16 ? $2 : 16)) --out $dir \
        > $E/quality_B$1_W$2.log 2>&1
    measured $dir
}
across() {  # learned and golden at B=$1, W=$2 on the positions >= $3 (those of a larger budget)
    local dir=$OUT/across_B$1_from$3
    [ -f $dir/measured.json ] && return 0
    $PY -m foresight eval fidelity --model smollm2-135m --traces $E/traces --policies learned,golden \
        --scorer $(scorer $1 $2) --golden $E/golden_B$1_W$2 --budget $1 --interval $2 --score-from $3 --out $dir \
        --quiet \
        > $E/across_B$1_from$3.log 2>&1
    measured $dir
}
scorer 32 8 > /dev/null  # the moved B=32 scorer, once, before the stages that run beside each other read it
stamp "quality at B=32, 64, 128"
quality 64 16 & q64=$!
quality 128 32 & q128=$!
wait $q64 && wait $q128
quality 32 8 & q32=$!
stamp "learned on the positions of larger budgets"
across 32 8 80 && across 32 8 160 && across 64 16 160
wait $q32
stamp done
