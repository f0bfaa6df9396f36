#!/usr/bin/env bash
# session 21: the B=64/W=16 scorer packaged from session 12 to 25 (now benchmarks/results/quality_B64_recipe336/scorer) on
# traces of another problem set (AIME 2024 + 2025, 60 problems)
set -euo pipefail
cd "$(dirname "$0")/../../.."; E=runs/quality/aime; PY=.venv/bin/python
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
export OMP_NUM_THREADS=1
stamp traces
bash benchmarks/quality/aime_traces.sh $E
stamp golden
two_ranks $PY -m foresight golden --traces $E/traces --out $E/golden_B64_W16 --budget 64 --interval 16 --no-progress
stamp quality
OMP_NUM_THREADS=2 $PY benchmarks/quality/run.py --model smollm2-135m --traces $E/traces \
    --setting 64:16=$E/golden_B64_W16 --scorer packaged=benchmarks/results/quality_B64_recipe336/scorer \
    --scorer packaged_sample=benchmarks/results/quality_B64_recipe336/scorer --policy-arg packaged_sample.selection=sample \
    --policies tova,rkv,snapkv,h2o,streaming_llm,lazy --out $E/quality_B64
stamp done
