#!/usr/bin/env bash
# session 36 (issue 13), written while alt.sh's measurement was running, before any of its numbers: alt.sh trained
# the adapted model's scorer with two DAgger rounds (to fit the session); the packaged recipe has three. This extends
# that run to three rounds (`--resume` with dagger_rounds=3 continues a finished run exactly as a three-round run)
# and measures the round-3 scorer like alt.sh. It is run whatever alt.sh shows, and both are reported; the
# decision rule is alt.sh's, applied to each (the three-round system is the one to claim, being the packaged recipe,
# if the two disagree). About 25 min on 2 cores alone; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}; PY=${PY:-.venv/bin/python}; A=$E/adapt_s30b_B64/adapter S=foresight/scorers/smollm2-135m-b64-w16
R=benchmarks/results/adapt_B64_W16_s36 L=$E/golden_train_B64_W16_a30b SL=$E/sl_a30b_B64_W16
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$HOME/.cache/torch_extensions OMP_NUM_THREADS=1
[ -f $SL/rounds/round-2/scorer/config.json ] || { echo "adapt_B64_W16_s36/alt3.sh: error: run alt.sh first" >&2; exit 2; }
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "DAgger round 3 (adapted model)"
[ -f $SL/rounds/round-3/scorer/config.json ] || E=$E PY=$PY PORT=29817 bash benchmarks/quality/train_sl.sh 64 16 $SL \
    adapter=$A labels=$L feature_cache=$E/features_a30b dagger_rounds=3
stamp "measure"
measure() {  # out dir, extra args
  local out=$1; shift
  [ -f $out/adapt_eval.json ] || $PY benchmarks/adapt_eval.py --adapter $A --traces $E/heldout_traces \
    --policies learned --scorer $S --other-scorer --adapted-scorer $SL/rounds/round-3/scorer --budget 64 \
    --interval 16 --out $out "$@"
}
measure $E/adapt_s36r3_eval_B64 --policy-arg selection=topk --policy-arg age_prior=0 > $E/adapt_s36r3_eval_B64.log 2>&1 & p1=$!
measure $E/adapt_s36r3_eval_B64_sampled --policy-arg selection=sample --policy-arg temperature=0.005 \
  > $E/adapt_s36r3_eval_B64_sampled.log 2>&1 & p2=$!
wait $p1; wait $p2
for s in "" _sampled; do
  cp $E/adapt_s36r3_eval_B64$s/adapt_eval.json $R/eval_B64_r3$s.json
  cp $E/adapt_s36r3_eval_B64$s/adapt_eval.md $R/eval_B64_r3$s.md
  $PY benchmarks/adapt_compare.py $E/adapt_s36r3_eval_B64$s/adapt_eval.json $E/adapt_s34_eval_B64$s/adapt_eval.json \
    --systems --json $R/s36r3_vs_s34$s.json --md $R/s36r3_vs_s34$s.md
  $PY benchmarks/adapt_compare.py $E/adapt_s36r3_eval_B64$s/adapt_eval.json $E/adapt_s36_eval_B64$s/adapt_eval.json \
    --systems --json $R/s36r3_vs_s36r2$s.json --md $R/s36r3_vs_s36r2$s.md
done
stamp done
