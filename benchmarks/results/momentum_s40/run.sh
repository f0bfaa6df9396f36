#!/usr/bin/env bash
# session 40: the second part of sampling's lead over top-k (issue 14, "Selection"). Session 39 found that a margin
# for the W newest candidates recovers most of top-k's deficit to sampling where top-k collapses, but not the
# broader hedge over borderline entries of every age: under top-k one low score at one event evicts an entry for
# good, however well it scored before. Test: top-k on each entry's exponential moving average of its scores across
# events (`--policy-arg score_momentum=m`, new; newcomers judged on their first score), the packaged scorers.
#
# Rule, fixed before any number: on session 31's validation traces (8 problems held out inside training, 6 traces
# each; `STAGE=traces bash benchmarks/results/temperature_s31/sweep.sh` rebuilds them), paired by problem against
# top-k without it, m in {0.25, 0.5, 0.75}; the m with the lowest pooled ratio at each budget is adopted only if its
# interval is below zero at both budgets. Only then are the benchmark, the unused problems x3 and AIME measured
# (STAGE=beyond, `beyond.sh`). Outputs under $O (default runs/s40). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=.venv/bin/python O=${O:-runs/s40} V=runs/quality/val_traces
R=benchmarks/results
S64=foresight/scorers/smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
[ -f $V/plan.json ] || { echo "momentum_s40/run.sh: error: $V missing (STAGE=traces bash $R/temperature_s31/sweep.sh)" >&2; exit 2; }
mkdir -p $O
ev() {  # budget interval scorer traces out momentum [sample T]
  local extra=(--policy-arg score_momentum=$6); if [ -n "${7:-}" ]; then extra+=(--policy-arg selection=sample --policy-arg temperature=$7); else extra+=(--policy-arg selection=topk --policy-arg age_prior=0); fi
  [ -f $O/$5/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $4 \
    --policies learned --scorer $3 --budget $1 --interval $2 --batch-size 4 "${extra[@]}" --out $O/$5 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@"; }
echo "== $(date -u +%FT%TZ) validation"
ev 64 16 $S64 $V v64_m25 0.25 & p1=$!; ev 128 32 $S128 $V v128_m25 0.25 & p2=$!; wait $p1; wait $p2
ev 64 16 $S64 $V v64_m50 0.5 & p1=$!; ev 128 32 $S128 $V v128_m50 0.5 & p2=$!; wait $p1; wait $p2
ev 64 16 $S64 $V v64_m75 0.75 & p1=$!; ev 128 32 $S128 $V v128_m75 0.75 & p2=$!; wait $p1; wait $p2
G64=$R/temperature_s31/B64/quality.json:tova G128=$R/temperature_s31/B128/quality.json:tova
{ for m in m25 m50 m75; do
    cmp $O/v64_$m/fidelity.json:learned $R/ensemble_s33/val_avg3_topk/fidelity.json:learned --budget 64 --interval 16 \
      --by-problem --gap $G64
  done
  for m in m25 m50 m75; do
    cmp $O/v128_$m/fidelity.json:learned $R/temperature_s31/B128/quality.json:topk --budget 128 --interval 32 \
      --by-problem --gap $G128
  done
} | tee $O/validation_compare.txt
echo "== $(date -u +%FT%TZ) done"
