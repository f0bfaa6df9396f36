#!/usr/bin/env bash
# The experiment scripts' one evaluation: the `learned` policy alone with one scorer on one trace set, one thread,
# batch 4 (the batching every committed sampled run used), skipped when OUT already holds its fidelity.json.
#
#   bash benchmarks/quality/eval_learned.sh SCORER TRACES OUT B W [eval fidelity args ...]
#   e.g. ... runs/s43/dagger_t005/scorer runs/quality/val_traces runs/s43/v_t005 64 16 \
#        --policy-arg selection=sample --policy-arg temperature=0.005
#
# Environment: PY (default .venv/bin/python).
set -euo pipefail
[ $# -ge 5 ] || { echo "eval_learned.sh: error: usage: eval_learned.sh SCORER TRACES OUT B W [ARGS ...]" >&2; exit 2; }
S=$1 T=$2 OUT=$3 B=$4 W=$5; shift 5
[ -f "$OUT/fidelity.json" ] || OMP_NUM_THREADS=1 ${PY:-.venv/bin/python} -m foresight eval fidelity \
    --model smollm2-135m --traces "$T" --policies learned --scorer "$S" --budget "$B" --interval "$W" --batch-size 4 \
    --out "$OUT" --quiet "$@"
