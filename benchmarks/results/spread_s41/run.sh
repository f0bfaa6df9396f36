#!/usr/bin/env bash
# session 41: is the packaged top-k spread (0.005, session 40) too small? Session 40 tried only 0.002 and 0.005, and
# the larger was much better at B=64 (-0.0052 -> -0.0190 against plain top-k on the validation traces), so the best
# value may lie above it. Test s in {0.01, 0.02} (0.02 is twice the hinge margin the scorers were trained with).
#
# Rule, fixed before any number (per budget: each packaged scorer records its own spread):
#   STAGE=validation (default): on session 31's 48 validation traces, paired by problem against the committed spread
#     0.005 runs of the same scorers (momentum_s40/v64_s005, v128_s005). At each budget the s with the lowest pooled
#     ratio goes on to STAGE=beyond only if its paired interval is below zero.
#   STAGE=beyond (SPREAD64 / SPREAD128 = the value that passed at that budget, or "none"): on the benchmark's 48
#     held-out traces, three more traces of each of the 16 unused problems (paired by problem) and the 60 AIME traces,
#     paired with the committed spread 0.005 runs (momentum_s40/held*_s, x16x3_*_s, aime*_s). The new value becomes
#     that budget's packaged default (foresight export --spread) only if all three differences point lower and none
#     has an interval above zero; otherwise 0.005 stays.
# Traces (must exist): `STAGE=traces bash benchmarks/results/temperature_s31/sweep.sh` (validation; needs the
# recipe's split: `python benchmarks/quality/split.py runs/quality/split`), `HELDOUT=48 STAGE=heldout bash
# benchmarks/quality/recipe.sh`, `STAGE=traces bash benchmarks/results/extra16x3_s31/run.sh`, `bash
# benchmarks/quality/aime_traces.sh runs/quality/aime`. Outputs under $O (default runs/s41). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s41} R=benchmarks/results M=benchmarks/results/momentum_s40
S64=foresight/scorers/smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
F=fidelity.json:learned
mkdir -p $O
ev() {  # budget interval scorer traces out spread
  [ -f $O/$5/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $4 \
    --policies learned --scorer $3 --budget $1 --interval $2 --batch-size 4 --policy-arg selection=topk --policy-arg age_prior=0 --policy-arg spread=$6 --out $O/$5 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@"; }
need() { for t in "$@"; do [ -e $t ] || { echo "spread_s41/run.sh: error: $t missing (see this script's header)" >&2; exit 2; }; done; }
case ${STAGE:-validation} in
validation)
  V=$E/val_traces; need $V/plan.json
  echo "== $(date -u +%FT%TZ) validation, spread 0.01 / 0.02"
  ev 64 16 $S64 $V v64_s010 0.01 & p1=$!; ev 128 32 $S128 $V v128_s010 0.01 & p2=$!; wait $p1; wait $p2
  ev 64 16 $S64 $V v64_s020 0.02 & p1=$!; ev 128 32 $S128 $V v128_s020 0.02 & p2=$!; wait $p1; wait $p2
  G64=$R/temperature_s31/B64/quality.json:tova G128=$R/temperature_s31/B128/quality.json:tova
  { for s in s010 s020; do
      cmp $O/v64_$s/$F $M/v64_s005/$F --budget 64 --interval 16 --by-problem --gap $G64
    done
    for s in s010 s020; do
      cmp $O/v128_$s/$F $M/v128_s005/$F --budget 128 --interval 32 --by-problem --gap $G128
    done
  } | tee $O/validation_compare.txt ;;
beyond)
  SP64=${SPREAD64:?SPREAD64: the B=64 value that passed STAGE=validation, or none}
  SP128=${SPREAD128:?SPREAD128: the B=128 value that passed STAGE=validation, or none}
  need $E/heldout_traces $E/extra16x3_traces $E/aime/traces
  Q64=$R/extra16x3_s31/B64/quality.json Q128=$R/extra16x3_s31/B128/quality.json
  echo "== $(date -u +%FT%TZ) beyond, spread $SP64 / $SP128"
  if [ "$SP64" != none ]; then
    ev 64 16 $S64 $E/heldout_traces held64 $SP64 & p1=$!; ev 64 16 $S64 $E/extra16x3_traces x16x3_64 $SP64 & p2=$!
    wait $p1; wait $p2; ev 64 16 $S64 $E/aime/traces aime64 $SP64
  fi
  if [ "$SP128" != none ]; then
    ev 128 32 $S128 $E/heldout_traces held128 $SP128 & p1=$!; ev 128 32 $S128 $E/extra16x3_traces x16x3_128 $SP128 & p2=$!
    wait $p1; wait $p2; ev 128 32 $S128 $E/aime/traces aime128 $SP128
  fi
  { if [ "$SP64" != none ]; then
      cmp $O/held64/$F $M/held64_s/$F --budget 64 --interval 16 --gap $R/quality_B64_recipe336/quality.json:tova
      cmp $O/x16x3_64/$F $M/x16x3_64_s/$F --budget 64 --interval 16 --gap $Q64:tova --by-problem
      cmp $O/aime64/$F $M/aime64_s/$F --budget 64 --interval 16 --gap $R/quality_B64_aime/quality.json:tova
    fi
    if [ "$SP128" != none ]; then
      cmp $O/held128/$F $M/held128_s/$F --budget 128 --interval 32 --gap $R/quality_B128_recipe336/quality.json:tova
      cmp $O/x16x3_128/$F $M/x16x3_128_s/$F --budget 128 --interval 32 --gap $Q128:tova --by-problem
      cmp $O/aime128/$F $M/aime128_s/$F --budget 128 --interval 32 --gap $R/quality_aime_packaged/quality.json:tova
    fi
  } | tee $O/beyond_compare.txt ;;
*) echo "spread_s41/run.sh: error: STAGE=${STAGE} (validation or beyond)" >&2; exit 2 ;;
esac
echo "== $(date -u +%FT%TZ) done"
