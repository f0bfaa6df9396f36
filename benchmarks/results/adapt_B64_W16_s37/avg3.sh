#!/usr/bin/env bash
# session 37 (issue 13): alternation with the packaged scorer's whole recipe. Session 36 trained ONE scorer for the
# adapted model (session 30's cycle-2 adapter, adapt_s30b) and found it level with the packaged three-run mean
# (round 3: 44.7% of the gap top-k against 45.6%), while averaging three runs made the base model's scorer about
# 0.008 better than one run (session 33). The packaged B=64 scorer is the mean of round 3 of a seed-0 run and rounds
# 3 and 4 of a seed-1 run; this script builds the same mean for the adapted model: round 3 of session 36's seed-0 run
# (sl_a30b_B64_W16) and rounds 3 and 4 of a seed-1 run of the same recipe (labels replayed by the adapted model,
# pre-RoPE features, adapter=...), averaged with benchmarks/average_scorers.py, measured like session 36
# (adapt_eval.py --adapted-scorer on the benchmark's 48 held-out traces, top-k and sampled T=0.005).
# Decision rule, fixed and committed before any number (alt.sh's, unchanged):
#   * issue 13's target is met under top-k only if the adapted system removes >= 50% of the base's gap to 1.0
#     (the share adapt_eval reports) with the paired interval below zero, and the full-cache CE stays within 1%
#     (the adapter is unchanged: x1.0077);
#   * "alternation helps under the packaged scorer" only if the adapted system beats session 34's (the same adapter
#     with the packaged scorer) at both selections with one paired interval below zero (adapt_compare --systems).
# Sampled at T=0.005 is reported beside, not claimed. The composition (three members, which rounds) is fixed here
# and no other mean is measured on these traces. About 75 min on 2 cores alone; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}; PY=${PY:-.venv/bin/python}; A=$E/adapt_s30b_B64/adapter S=foresight/scorers/smollm2-135m-b64-w16
R=benchmarks/results/adapt_B64_W16_s37 L=$E/golden_train_B64_W16_a30b SL0=$E/sl_a30b_B64_W16 SL1=$E/sl_a30b_B64_W16_seed1
AVG=$E/avg3_a30b_B64_W16
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$HOME/.cache/torch_extensions OMP_NUM_THREADS=1
for f in $A/adapter_config.json $L/plan.json $SL0/rounds/round-3/scorer/config.json \
         $E/adapt_s34_eval_B64/adapt_eval.json $E/adapt_s34_eval_B64_sampled/adapt_eval.json; do
  [ -f $f ] || { echo "adapt_B64_W16_s37/avg3.sh: error: $f missing (run adapt_B64_W16_s36/alt.sh and alt3.sh first)" >&2; exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "SL + 4 DAgger rounds, seed 1 (adapted model)"
[ -f $SL1/rounds/round-4/scorer/config.json ] || E=$E PY=$PY PORT=29819 bash benchmarks/quality/train_sl.sh 64 16 $SL1 \
    adapter=$A labels=$L feature_cache=$E/features_a30b seed=1 dagger_rounds=4
stamp "average"
[ -f $AVG/config.json ] || $PY benchmarks/average_scorers.py --out $AVG $SL0/rounds/round-3/scorer \
    $SL1/rounds/round-3/scorer $SL1/rounds/round-4/scorer
cp $AVG/config.json $R/avg3_config.json
stamp "measure"
measure() {  # out dir, extra args
  local out=$1; shift
  [ -f $out/adapt_eval.json ] || $PY benchmarks/adapt_eval.py --adapter $A --traces $E/heldout_traces \
    --policies learned --scorer $S --other-scorer --adapted-scorer $AVG --budget 64 --interval 16 --out $out "$@"
}
measure $E/adapt_s37_eval_B64 --policy-arg selection=topk --policy-arg age_prior=0 > $E/adapt_s37_eval_B64.log 2>&1 & p1=$!
measure $E/adapt_s37_eval_B64_sampled --policy-arg selection=sample --policy-arg temperature=0.005 \
  > $E/adapt_s37_eval_B64_sampled.log 2>&1 & p2=$!
wait $p1; wait $p2
for s in "" _sampled; do
  cp $E/adapt_s37_eval_B64$s/adapt_eval.json $R/eval_B64$s.json; cp $E/adapt_s37_eval_B64$s/adapt_eval.md $R/eval_B64$s.md
  $PY benchmarks/adapt_compare.py $E/adapt_s37_eval_B64$s/adapt_eval.json $E/adapt_s34_eval_B64$s/adapt_eval.json \
    --systems --json $R/s37_vs_s34$s.json --md $R/s37_vs_s34$s.md
  $PY benchmarks/adapt_compare.py $E/adapt_s37_eval_B64$s/adapt_eval.json $E/adapt_s36r3_eval_B64$s/adapt_eval.json \
    --systems --json $R/s37_vs_s36r3$s.json --md $R/s37_vs_s36r3$s.md
done
stamp done
