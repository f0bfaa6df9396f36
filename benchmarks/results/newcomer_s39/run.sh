#!/usr/bin/env bash
# session 39: why does sampled selection beat top-k (issue 14, "Selection")? Hypothesis: the candidates judged for
# the first time (the protected newest W of the previous event) are scored on the least evidence (W..2W queries),
# and top-k evicts a misjudged one for good, while sampling lets a share of them survive to be re-scored.
# Test: top-k with `newcomer_bonus` (added to those candidates' scores) on the packaged scorers.
#
# Rule, fixed before any number: on session 31's validation traces (8 problems held out inside training, 6 traces
# each; `temperature_s31/sweep.sh STAGE=traces` rebuilds them), paired by problem against top-k without the bonus,
# a bonus is adopted only if its interval is below zero at both budgets (the value chosen per budget as the lowest
# pooled ratio); then, and only then, the benchmark, the unused problems and AIME are measured (STAGE=beyond).
# Outputs under $O (default runs/s39). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s39} V=runs/quality/val_traces
R=benchmarks/results
S64=foresight/scorers/smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
[ -f $V/plan.json ] || { echo "newcomer_s39/run.sh: error: $V missing (STAGE=traces bash $R/temperature_s31/sweep.sh)" >&2; exit 2; }
mkdir -p $O
ev() {  # budget interval scorer traces out bonus [sample T]
  local extra=(--policy-arg newcomer_bonus=$6); if [ -n "${7:-}" ]; then extra+=(--policy-arg selection=sample --policy-arg temperature=$7); else extra+=(--policy-arg selection=topk --policy-arg age_prior=0); fi
  [ -f $O/$5/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $4 \
    --policies learned --scorer $3 --budget $1 --interval $2 --batch-size 4 "${extra[@]}" --out $O/$5 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@"; }
echo "== $(date -u +%FT%TZ) validation"
ev 64 16 $S64 $V v64_b005 0.005 & p1=$!; ev 128 32 $S128 $V v128_b003 0.003 & p2=$!; wait $p1; wait $p2
ev 64 16 $S64 $V v64_b01 0.01 & p1=$!; ev 128 32 $S128 $V v128_b006 0.006 & p2=$!; wait $p1; wait $p2
ev 64 16 $S64 $V v64_b02 0.02 & p1=$!; ev 128 32 $S128 $V v128_b012 0.012 & p2=$!; wait $p1; wait $p2
G64=$R/temperature_s31/B64/quality.json:tova G128=$R/temperature_s31/B128/quality.json:tova
{ for b in b005 b01 b02; do
    cmp $O/v64_$b/fidelity.json:learned $R/ensemble_s33/val_avg3_topk/fidelity.json:learned --budget 64 --interval 16 \
      --by-problem --gap $G64
  done
  cmp $R/ensemble_s33/val_avg3_t005/fidelity.json:learned $R/ensemble_s33/val_avg3_topk/fidelity.json:learned \
    --budget 64 --interval 16 --by-problem --gap $G64
  for b in b003 b006 b012; do
    cmp $O/v128_$b/fidelity.json:learned $R/temperature_s31/B128/quality.json:topk --budget 128 --interval 32 \
      --by-problem --gap $G128
  done
  cmp $R/temperature_s31/B128/quality.json:t003 $R/temperature_s31/B128/quality.json:topk --budget 128 --interval 32 \
    --by-problem --gap $G128
} | tee $O/validation_compare.txt
echo "== $(date -u +%FT%TZ) done"
