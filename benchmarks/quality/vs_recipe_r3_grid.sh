#!/usr/bin/env bash
# vs_recipe_r3.sh for a scorer with its own score scale (session 44: a sampling temperature belongs to a scorer): a
# B=64/W=16 scorer on session 31's 48 validation traces, top-k and sampled at T = 0.003, 0.005, 0.007 and 0.01 (the
# small grid the recipe's own scorer had when its T=0.005 was chosen on these traces), each sampled run paired by
# problem with the recipe's round 3 of seed 0 at its T=0.005 and top-k with its top-k (both committed in
# benchmarks/results/temperature_s31/B64/quality.json). Evaluations already under OUT_PREFIX_{topk,t003,...}/ are
# reused. Prints five compare.py results (T ascending, then top-k), each under a '#' line, and writes them to TXT.
#
#   bash benchmarks/quality/vs_recipe_r3_grid.sh SCORER OUT_PREFIX COMPARE_TXT
#
# Environment: E (the val_traces' parent, default runs/quality), PY (default .venv/bin/python).
set -euo pipefail
[ $# -eq 3 ] || { echo "vs_recipe_r3_grid.sh: error: usage: vs_recipe_r3_grid.sh SCORER OUT_PREFIX COMPARE_TXT" >&2
                  exit 2; }
S=$1 P=$2 TXT=$3
E=${E:-runs/quality} PY=${PY:-.venv/bin/python}
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$S" $E/val_traces "${P}_$1" 64 16 "${@:2}"; }
sampled() { ev t${1#0.} --policy-arg selection=sample --policy-arg temperature=$1; }
ev topk --policy-arg selection=topk & p1=$!; sampled 0.005 & p2=$!; wait $p1; wait $p2
sampled 0.003 & p1=$!; sampled 0.007 & p2=$!; wait $p1; wait $p2
sampled 0.01
Q=benchmarks/results/temperature_s31/B64/quality.json
C() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16 --by-problem --gap $Q:tova; }
{ for t in t003 t005 t007 t01; do echo "# sampled at $t - recipe round 3 at t005"; C "${P}_$t/fidelity.json:learned" $Q:t005; done
  echo "# top-k - recipe round 3 top-k"; C "${P}_topk/fidelity.json:learned" $Q:topk
} | tee "$TXT"
