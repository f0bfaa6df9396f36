#!/usr/bin/env bash
# session 39, after run.sh's validation step: the packaged B=64 scorer top-k with newcomer_bonus=$BONUS (default
# 0.01, the best of 0.005 / 0.01 / 0.02 on the validation traces) on the sets beyond the validation traces: the
# benchmark's 48 held-out traces, three more traces of each of the 16 unused problems (48, paired by problem) and the
# 60 AIME traces; paired per trace with the committed top-k runs of the same scorer on the same traces (compare.py
# checks tokens and full-cache CE). Rebuilds the traces first (about 25 min on 2 cores). Rerun to resume.
# This is outside run.sh's rule (which asks for both budgets); its own rule, fixed before any number of these sets:
# the bonus becomes the packaged B=64 scorer's recorded default only if, on all three sets, the paired Δ against
# top-k points lower and on at least two of them its interval is below zero.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s39} BONUS=${BONUS:-0.01} R=benchmarks/results
S64=foresight/scorers/smollm2-135m-b64-w16 N=b${BONUS#0.}
echo "== $(date -u +%FT%TZ) traces"
HELDOUT=48 STAGE=heldout bash benchmarks/quality/recipe.sh
STAGE=traces bash $R/extra16x3_s31/run.sh
bash benchmarks/quality/aime_traces.sh $E/aime
ev() {  # traces out [sample T]
  local extra=(--policy-arg newcomer_bonus=$BONUS); [ -n "${3:-}" ] && extra+=(--policy-arg selection=sample --policy-arg temperature=$3)
  [ -f $O/$2/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $1 \
    --policies learned --scorer $S64 --budget 64 --interval 16 --batch-size 4 "${extra[@]}" --out $O/$2 --quiet
}
echo "== $(date -u +%FT%TZ) evaluations"
ev $E/heldout_traces held_$N & p1=$!; ev $E/extra16x3_traces x16x3_$N & p2=$!; wait $p1; wait $p2
ev $E/aime/traces aime_$N
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
F=fidelity.json:learned Q3=$R/extra16x3_s31/B64/quality.json
{ cmp $O/held_$N/$F $R/ensemble_s33/held_topk/$F --gap $R/quality_B64_recipe336/quality.json:tova
  cmp $O/x16x3_$N/$F $R/ensemble_s33/x16x3_topk/$F --gap $Q3:tova --by-problem
  cmp $O/aime_$N/$F $R/ensemble_s33/aime_topk/$F --gap $R/quality_B64_aime/quality.json:tova
} | tee $O/beyond_compare_$N.txt
echo "== $(date -u +%FT%TZ) done"
