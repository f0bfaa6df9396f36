#!/usr/bin/env bash
# session 41, second question: do session 39's newcomer margin and session 40's spread add up? They act on different
# parts of top-k's deficit to sampling (the first judgement of the W newest candidates; near-tied neighbours evicted
# as one span). Session 39's margin alone, on plain top-k, missed its rule by +0.0006 at B=64. Test: the packaged
# scorers top-k with spread 0.005 (their recorded default, given explicitly) plus `newcomer_bonus` b, B=64 b in
# {0.01, 0.02}, B=128 b in {0.006, 0.012} (session 39's two largest values at each budget).
#
# Rule, fixed before any number (per budget):
#   STAGE=validation (default): on session 31's 48 validation traces, paired by problem against the committed spread
#     0.005 runs (momentum_s40/v64_s005, v128_s005). At each budget the b with the lowest pooled ratio goes on to
#     STAGE=beyond only if its paired interval is below zero.
#   STAGE=beyond (BONUS64 / BONUS128 = the value that passed, or none): the benchmark's 48 held-out traces, the 48
#     unused-problem traces (by problem) and the 60 AIME traces, paired with the committed spread 0.005 runs
#     (momentum_s40/held*_s, x16x3_*_s, aime*_s). The margin becomes that packaged scorer's recorded top-k default
#     only if all three differences point lower and none has an interval above zero; otherwise it stays opt-in.
# Traces: as in run.sh's header. Outputs under $O (default runs/s41). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s41} R=benchmarks/results M=benchmarks/results/momentum_s40
S64=foresight/scorers/smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
F=fidelity.json:learned
mkdir -p $O
ev() {  # budget interval scorer traces out bonus
  [ -f $O/$5/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $4 \
    --policies learned --scorer $3 --budget $1 --interval $2 --batch-size 4 --policy-arg selection=topk --policy-arg age_prior=0 --policy-arg spread=0.005 \
    --policy-arg newcomer_bonus=$6 --out $O/$5 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@"; }
need() { for t in "$@"; do [ -e $t ] || { echo "spread_s41/newcomer.sh: error: $t missing (see run.sh's header)" >&2; exit 2; }; done; }
case ${STAGE:-validation} in
validation)
  V=$E/val_traces; need $V/plan.json
  echo "== $(date -u +%FT%TZ) validation, spread 0.005 + newcomer bonus"
  ev 64 16 $S64 $V v64_nb010 0.01 & p1=$!; ev 128 32 $S128 $V v128_nb006 0.006 & p2=$!; wait $p1; wait $p2
  ev 64 16 $S64 $V v64_nb020 0.02 & p1=$!; ev 128 32 $S128 $V v128_nb012 0.012 & p2=$!; wait $p1; wait $p2
  G64=$R/temperature_s31/B64/quality.json:tova G128=$R/temperature_s31/B128/quality.json:tova
  { for s in nb010 nb020; do
      cmp $O/v64_$s/$F $M/v64_s005/$F --budget 64 --interval 16 --by-problem --gap $G64
    done
    for s in nb006 nb012; do
      cmp $O/v128_$s/$F $M/v128_s005/$F --budget 128 --interval 32 --by-problem --gap $G128
    done
  } | tee $O/newcomer_validation_compare.txt ;;
beyond)
  B64=${BONUS64:?BONUS64: the B=64 value that passed STAGE=validation, or none}
  B128=${BONUS128:?BONUS128: the B=128 value that passed STAGE=validation, or none}
  need $E/heldout_traces $E/extra16x3_traces $E/aime/traces
  Q64=$R/extra16x3_s31/B64/quality.json Q128=$R/extra16x3_s31/B128/quality.json
  echo "== $(date -u +%FT%TZ) beyond, newcomer bonus $B64 / $B128 (spread 0.005)"
  pair() {  # traces out-suffix: the two budgets side by side (one skipped when its value is none)
    local p1= p2=
    [ "$B64" = none ] || { ev 64 16 $S64 $1 nb_${2}64 $B64 & p1=$!; }
    [ "$B128" = none ] || { ev 128 32 $S128 $1 nb_${2}128 $B128 & p2=$!; }
    [ -z "$p1" ] || wait $p1; [ -z "$p2" ] || wait $p2
  }
  pair $E/aime/traces aime; pair $E/heldout_traces held; pair $E/extra16x3_traces x16x3_
  { if [ "$B64" != none ]; then
      cmp $O/nb_held64/$F $M/held64_s/$F --budget 64 --interval 16 --gap $R/quality_B64_recipe336/quality.json:tova
      cmp $O/nb_x16x3_64/$F $M/x16x3_64_s/$F --budget 64 --interval 16 --gap $Q64:tova --by-problem
      cmp $O/nb_aime64/$F $M/aime64_s/$F --budget 64 --interval 16 --gap $R/quality_B64_aime/quality.json:tova
    fi
    if [ "$B128" != none ]; then
      cmp $O/nb_held128/$F $M/held128_s/$F --budget 128 --interval 32 --gap $R/quality_B128_recipe336/quality.json:tova
      cmp $O/nb_x16x3_128/$F $M/x16x3_128_s/$F --budget 128 --interval 32 --gap $Q128:tova --by-problem
      cmp $O/nb_aime128/$F $M/aime128_s/$F --budget 128 --interval 32 --gap $R/quality_aime_packaged/quality.json:tova
    fi
  } | tee $O/newcomer_beyond_compare.txt ;;
*) echo "spread_s41/newcomer.sh: error: STAGE=${STAGE} (validation or beyond)" >&2; exit 2 ;;
esac
echo "== $(date -u +%FT%TZ) done"
