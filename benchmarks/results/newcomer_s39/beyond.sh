#!/usr/bin/env bash
# session 39, after run.sh's validation step, which did NOT pass its rule: B=64's lowest pooled bonus (0.02) is
# -0.0307 [-0.0641, +0.0006] against top-k, its interval not below zero (0.01: -0.0276 [-0.0547, -0.0024]; B=128's
# 0.012: -0.0058 [-0.0118, -0.0005]). So nothing is adopted; this exploratory run asks whether the B=64 effect holds
# beyond the validation traces. The packaged B=64 scorer top-k with newcomer_bonus=$BONUS (default 0.02, run.sh's
# choice) on the benchmark's 48 held-out traces, three more traces of each of the 16 unused problems (48, paired by
# problem) and the 60 AIME traces, paired per trace with the committed top-k runs of the same scorer on the same
# traces (compare.py checks tokens and full-cache CE); and, on the validation traces, sampled T=0.005 with the bonus
# against sampled without it. Rebuilds the traces first (about 25 min on 2 cores). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s39} BONUS=${BONUS:-0.02} R=benchmarks/results
S64=foresight/scorers/smollm2-135m-b64-w16 N=b${BONUS#0.}
echo "== $(date -u +%FT%TZ) traces"
HELDOUT=48 STAGE=heldout bash benchmarks/quality/recipe.sh
STAGE=traces bash $R/extra16x3_s31/run.sh
bash benchmarks/quality/aime_traces.sh $E/aime
ev() {  # traces out [sample T]
  local extra=(--policy-arg newcomer_bonus=$BONUS); if [ -n "${3:-}" ]; then extra+=(--policy-arg selection=sample --policy-arg temperature=$3); else extra+=(--policy-arg selection=topk --policy-arg age_prior=0); fi
  [ -f $O/$2/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $1 \
    --policies learned --scorer $S64 --budget 64 --interval 16 --batch-size 4 "${extra[@]}" --out $O/$2 --quiet
}
echo "== $(date -u +%FT%TZ) evaluations"
ev $E/aime/traces aime_$N & p1=$!; ev $E/val_traces v64_${N}_t005 0.005 & p2=$!; wait $p1; wait $p2
ev $E/heldout_traces held_$N & p1=$!; ev $E/extra16x3_traces x16x3_$N & p2=$!; wait $p1; wait $p2
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
F=fidelity.json:learned Q3=$R/extra16x3_s31/B64/quality.json
{ cmp $O/held_$N/$F $R/ensemble_s33/held_topk/$F --gap $R/quality_B64_recipe336/quality.json:tova
  cmp $O/x16x3_$N/$F $R/ensemble_s33/x16x3_topk/$F --gap $Q3:tova --by-problem
  cmp $O/aime_$N/$F $R/ensemble_s33/aime_topk/$F --gap $R/quality_B64_aime/quality.json:tova
  cmp $O/v64_${N}_t005/$F $R/ensemble_s33/val_avg3_t005/$F --gap $R/temperature_s31/B64/quality.json:tova --by-problem
} | tee $O/beyond_compare_$N.txt
echo "== $(date -u +%FT%TZ) done"
