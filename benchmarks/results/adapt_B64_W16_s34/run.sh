#!/usr/bin/env bash
# session 34 (issue 13): session 30's adapter (cycle 2; trained under the B=64 scorer packaged in sessions 26-32,
# 154ce316...) deployed with the scorer packaged since session 33 (the mean of three runs, 8757389d..., which beats
# 154ce316... on the base model). Does the better scorer add to the adapter, or do they fix the same losses again
# (session 30)? The 48 held-out traces, top-k and sampled at the packaged T=0.005, each system against its own base
# (adapter disabled, same scorer); then adapt_compare.py --systems against session 30's measurement (top-k; the
# sampled one was at T=0.003). About 12 min on 2 cores alone; needs runs/quality/adapt_s30b_B64 (adapt_s30.sh).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; S=foresight/scorers/smollm2-135m-b64-w16
R=benchmarks/results/adapt_B64_W16_s34 A=$E/adapt_s30b_B64/adapter
[ -f $A/adapter_config.json ] || { echo "adapt_B64_W16_s34/run.sh: error: $A missing (run ../adapt_B64_W16_s30/adapt_s30.sh first)" >&2; exit 2; }
measure() {  # out dir, extra args
  local out=$1; shift
  [ -f $out/adapt_eval.json ] || OMP_NUM_THREADS=1 $PY benchmarks/adapt_eval.py --adapter $A \
    --traces $E/heldout_traces --policies learned --scorer $S --other-scorer --budget 64 --interval 16 --out $out "$@"
}
echo "== $(date -u +%FT%TZ) measure"
measure $E/adapt_s34_eval_B64 --policy-arg selection=topk --policy-arg age_prior=0 > $E/adapt_s34_eval_B64.log 2>&1 & p1=$!
measure $E/adapt_s34_eval_B64_sampled --policy-arg selection=sample --policy-arg temperature=0.005 \
  > $E/adapt_s34_eval_B64_sampled.log 2>&1 & p2=$!
wait $p1; wait $p2
$PY benchmarks/adapt_compare.py $E/adapt_s34_eval_B64/adapt_eval.json $E/adapt_s30b_eval_B64/adapt_eval.json --systems \
  --json $R/s34_vs_s30b.json --md $R/s34_vs_s30b.md
echo "== $(date -u +%FT%TZ) done"
