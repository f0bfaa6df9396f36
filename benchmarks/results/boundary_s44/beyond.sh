#!/usr/bin/env bash
# session 44, after run.sh: the boundary-loss round 3 on the sets beyond the validation traces (the benchmark's 48
# held-out traces, the 16 unused problems, 48 more traces of them, 60 AIME traces), sampled at T=0.005 and plain top-k.
# Each is paired with the recipe's own round 3 of the same seed (the gap loss; the packaged B=64 scorer of sessions
# 26-32, whose runs on these sets are committed) and, sampled, with the packaged three-run ensemble (ensemble_s33).
# Written before any of these numbers; measured whatever run.sh's rule says, reported as measured, no decision rides
# on it (one run is a draw: session 34).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s44} R=benchmarks/results
S=$O/boundary/rounds/round-3/scorer
[ -f $S/config.json ] || { echo "beyond.sh: error: $S missing (run run.sh first)" >&2; exit 2; }
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh $S "$1" $O/$2 64 16 "${@:3}"; }
pair() {
  ev "$1" ${2}_t005 --policy-arg selection=sample --policy-arg temperature=0.005 & p1=$!
  ev "$1" ${2}_topk --policy-arg selection=topk & p2=$!
  wait $p1; wait $p2
}
echo "== $(date -u +%FT%TZ) beyond"
pair $E/heldout_traces held; pair $E/heldout_extra16_traces x16; pair $E/extra16x3_traces x16x3; pair $E/aime/traces aime
F=fidelity.json:learned En=$R/ensemble_s33 Q3=$R/extra16x3_s31/B64/quality.json
GH=$R/quality_B64_recipe336/quality.json:tova GX=$R/quality_B64_recipe336/extra16/quality.json:tova
GA=$R/quality_B64_aime/quality.json:tova
cmp() { echo "# $1  -  $2"; $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
{ echo "## against the recipe's round 3 (gap loss, same seed): benchmark, extra16, extra16x3, AIME; sampled, top-k"
  PY=$PY bash benchmarks/quality/beyond_vs_recipe_r3.sh $O
  echo "## sampled, against the packaged ensemble (three gap-loss runs)"
  cmp $O/held_t005/$F $En/held_t005/$F --gap $GH
  cmp $O/x16_t005/$F $En/x16_t005/$F --gap $GX
  cmp $O/x16x3_t005/$F $En/x16x3_t005/$F --gap $Q3:tova --by-problem
  cmp $O/aime_t005/$F $En/aime_t005/$F --gap $GA
} | tee $R/boundary_s44/beyond_compare.txt
echo "== $(date -u +%FT%TZ) done"
