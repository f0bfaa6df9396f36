#!/usr/bin/env bash
# session 40, run only if spread.sh's validation rule passes (written before these numbers): the spread it chose at
# each budget (SPREAD64, SPREAD128), top-k, the packaged scorers, on the benchmark's 48 held-out traces, three more
# traces of each of the 16 unused problems (48, paired by problem) and the 60 AIME traces, each paired with the
# committed top-k run of the same scorer on the same traces (compare.py checks tokens and full-cache CE). Rule, fixed
# before any of these numbers: spread becomes what the packaged scorers' cards recommend only if all six differences
# point lower and none has an interval above zero; otherwise it stays an opt-in argument. The traces must exist
# (`HELDOUT=48 STAGE=heldout bash benchmarks/quality/recipe.sh`, `STAGE=traces bash
# benchmarks/results/extra16x3_s31/run.sh`, `bash benchmarks/quality/aime_traces.sh runs/quality/aime`). Rerun to
# resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s40} R=benchmarks/results
S64=foresight/scorers/smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
SP64=${SPREAD64:?set SPREAD64 to the B=64 choice of spread.sh} SP128=${SPREAD128:?set SPREAD128 to the B=128 choice of spread.sh}
for t in $E/heldout_traces $E/extra16x3_traces $E/aime/traces; do
  [ -d $t ] || { echo "spread_beyond.sh: error: $t missing (see this script's header)" >&2; exit 2; }
done
ev() {  # budget interval scorer traces out spread
  [ -f $O/$5/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $4 \
    --policies learned --scorer $3 --budget $1 --interval $2 --batch-size 4 --policy-arg selection=topk --policy-arg age_prior=0 --policy-arg spread=$6 --out $O/$5 --quiet
}
echo "== $(date -u +%FT%TZ) beyond, spread $SP64 / $SP128"
ev 64 16 $S64 $E/aime/traces aime64_s $SP64 & p1=$!; ev 128 32 $S128 $E/aime/traces aime128_s $SP128 & p2=$!; wait $p1; wait $p2
ev 64 16 $S64 $E/heldout_traces held64_s $SP64 & p1=$!; ev 128 32 $S128 $E/heldout_traces held128_s $SP128 & p2=$!; wait $p1; wait $p2
ev 64 16 $S64 $E/extra16x3_traces x16x3_64_s $SP64 & p1=$!; ev 128 32 $S128 $E/extra16x3_traces x16x3_128_s $SP128 & p2=$!; wait $p1; wait $p2
cmp() { $PY benchmarks/quality/compare.py "$@"; }
F=fidelity.json:learned Q64=$R/extra16x3_s31/B64/quality.json Q128=$R/extra16x3_s31/B128/quality.json
A128=$R/quality_aime_packaged/quality.json
{ cmp $O/held64_s/$F $R/ensemble_s33/held_topk/$F --budget 64 --interval 16 --gap $R/quality_B64_recipe336/quality.json:tova
  cmp $O/x16x3_64_s/$F $R/ensemble_s33/x16x3_topk/$F --budget 64 --interval 16 --gap $Q64:tova --by-problem
  cmp $O/aime64_s/$F $R/ensemble_s33/aime_topk/$F --budget 64 --interval 16 --gap $R/quality_B64_aime/quality.json:tova
  cmp $O/held128_s/$F $R/quality_B128_prekey_dagger/ev128_prekey/$F --budget 128 --interval 32 \
    --gap $R/quality_B128_recipe336/quality.json:tova
  cmp $O/x16x3_128_s/$F $Q128:topk --budget 128 --interval 32 --gap $Q128:tova --by-problem
  cmp $O/aime128_s/$F $A128:packaged --budget 128 --interval 32 --gap $A128:tova
} | tee $O/spread_beyond_compare.txt
echo "== $(date -u +%FT%TZ) done"
