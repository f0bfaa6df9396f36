#!/usr/bin/env bash
# session 36 (issue 13): alternation under the recipe packaged since session 33. Session 30's adapter (cycle 2,
# adapt_s30b) gets a scorer trained for the adapted model: golden labels of the 336 training traces replayed by the
# adapted model, then the packaged members' recipe (benchmarks/quality/train_sl.sh: SL 2,400 steps, pre-RoPE
# features, seed 0) with adapter=..., two DAgger rounds (session 20's alternation had two; three do not fit the
# session). Measured on the benchmark's 48 held-out traces with adapt_eval.py --adapted-scorer: base model with the
# packaged B=64 scorer (the three-run mean) against the adapted model with its own scorer, top-k and sampled T=0.005.
# Decision rule, fixed before any number:
#   * issue 13's target is met under top-k only if the adapted system removes >= 50% of the base's gap to 1.0
#     (the share adapt_eval reports) with the paired interval below zero, and the full-cache CE stays within 1%
#     (the adapter is unchanged: x1.0077 in sessions 30 and 34);
#   * "alternation helps under the packaged scorer" only if the adapted system beats session 34's (the same adapter
#     with the packaged scorer) at both selections with one paired interval below zero (adapt_compare --systems).
# Sampled at T=0.005 is reported beside, not claimed. About 80 min on 2 cores alone; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}; PY=${PY:-.venv/bin/python}; A=$E/adapt_s30b_B64/adapter S=foresight/scorers/smollm2-135m-b64-w16
R=benchmarks/results/adapt_B64_W16_s36 L=$E/golden_train_B64_W16_a30b SL=$E/sl_a30b_B64_W16
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$HOME/.cache/torch_extensions OMP_NUM_THREADS=1
for f in $A/adapter_config.json $E/train_traces/plan.json $E/adapt_s34_eval_B64/adapt_eval.json \
         $E/adapt_s34_eval_B64_sampled/adapt_eval.json; do
  [ -f $f ] || { echo "adapt_B64_W16_s36/alt.sh: error: $f missing (run adapt_B64_W16_s30/adapt_s30.sh and adapt_B64_W16_s34/run.sh first)" >&2; exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "golden labels (adapted model)"
two_ranks $PY -m foresight golden --adapter $A --allow-other-model --traces $E/train_traces --out $L \
    --budget 64 --interval 16 --no-progress
stamp "SL + 2 DAgger rounds (adapted model)"
[ -f $SL/scorer/config.json ] || E=$E PY=$PY PORT=29817 bash benchmarks/quality/train_sl.sh 64 16 $SL \
    adapter=$A labels=$L feature_cache=$E/features_a30b dagger_rounds=2
stamp "measure"
measure() {  # out dir, extra args
  local out=$1; shift
  [ -f $out/adapt_eval.json ] || $PY benchmarks/adapt_eval.py --adapter $A --traces $E/heldout_traces \
    --policies learned --scorer $S --other-scorer --adapted-scorer $SL/scorer --budget 64 --interval 16 --out $out "$@"
}
measure $E/adapt_s36_eval_B64 --policy-arg selection=topk --policy-arg age_prior=0 > $E/adapt_s36_eval_B64.log 2>&1 & p1=$!
measure $E/adapt_s36_eval_B64_sampled --policy-arg selection=sample --policy-arg temperature=0.005 \
  > $E/adapt_s36_eval_B64_sampled.log 2>&1 & p2=$!
wait $p1; wait $p2
for s in "" _sampled; do
  cp $E/adapt_s36_eval_B64$s/adapt_eval.json $R/eval_B64$s.json; cp $E/adapt_s36_eval_B64$s/adapt_eval.md $R/eval_B64$s.md
  $PY benchmarks/adapt_compare.py $E/adapt_s36_eval_B64$s/adapt_eval.json $E/adapt_s34_eval_B64$s/adapt_eval.json \
    --systems --json $R/s36_vs_s34$s.json --md $R/s36_vs_s34$s.md
done
stamp done
