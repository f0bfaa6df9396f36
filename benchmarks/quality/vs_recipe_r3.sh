#!/usr/bin/env bash
# A B=64/W=16 scorer on session 31's 48 validation traces (8 problems held out inside training), plain top-k and
# sampled at T=0.005, each paired by problem with the recipe's own round-3 scorer of seed 0 (the packaged B=64 scorer
# of sessions 26-32, benchmarks/results/quality_B64_prekey_dagger/scorer, SHA-256 154ce316...), whose runs are
# committed in benchmarks/results/temperature_s31/B64/quality.json (stages t005 and topk). Evaluations already under
# OUT_PREFIX_{t005,topk}/ are reused.
#
#   bash benchmarks/quality/vs_recipe_r3.sh SCORER OUT_PREFIX COMPARE_TXT
#
# Environment: E (the val_traces' parent, default runs/quality), PY (default .venv/bin/python).
set -euo pipefail
[ $# -eq 3 ] || { echo "vs_recipe_r3.sh: error: usage: vs_recipe_r3.sh SCORER OUT_PREFIX COMPARE_TXT" >&2; exit 2; }
S=$1 P=$2 TXT=$3
E=${E:-runs/quality} PY=${PY:-.venv/bin/python}
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$S" $E/val_traces "$P$1" 64 16 "${@:2}"; }
ev _topk --policy-arg selection=topk & p1=$!
ev _t005 --policy-arg selection=sample --policy-arg temperature=0.005 & p2=$!
wait $p1; wait $p2
F=fidelity.json:learned Q=benchmarks/results/temperature_s31/B64/quality.json
{ $PY benchmarks/quality/compare.py "${P}_t005/$F" $Q:t005 --budget 64 --interval 16 --by-problem --gap $Q:tova
  $PY benchmarks/quality/compare.py "${P}_topk/$F" $Q:topk --budget 64 --interval 16 --by-problem --gap $Q:tova
} | tee "$TXT"
