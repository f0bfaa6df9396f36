#!/usr/bin/env bash
# session 35, after run.sh: what its decision rule allows next (written before run.sh's numbers existed).
#   bash beyond.sh avg4   # if the two-sample scorer (round 3) beat the one-sample round 3 ("more data helps") but not
#                         # the packaged three-run mean: avg4 = the exact mean of the packaged mean's three members
#                         # and the two-sample scorer (equal weights, benchmarks/average_scorers.py), on the
#                         # validation traces, sampled at T=0.005 and top-k, paired by problem against the packaged
#                         # mean. avg4 replaces it only if both selections point lower and one interval is below zero.
#   bash beyond.sh d2x    # the two-sample scorer on the benchmark's 48 held-out traces, the 16 unused problems (one
#   bash beyond.sh avg4-beyond   # trace each, and three more each) and AIME, against the packaged mean's runs
#                         # (ensemble_s33), where the rule let it (or avg4) replace the packaged scorer.
# Outputs under $O (default runs/s35); rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s35}
SL=$E/sl_B64_W16_prekey_data2x R=$E/sl_B64_W16_prekey_r4/rounds P=benchmarks/results/quality_B64_prekey_dagger/scorer
S31=benchmarks/results/temperature_s31/B64/quality.json S33=benchmarks/results/ensemble_s33
export OMP_NUM_THREADS=1
case ${1:-} in
  avg4) ;; d2x) S=$SL/scorer ;; avg4-beyond) S=$O/avg4 ;;
  *) echo "beyond.sh: error: usage: beyond.sh avg4 | d2x | avg4-beyond" >&2; exit 2 ;;
esac
for f in $SL/scorer/config.json $R/round-3/scorer/config.json $R/round-4/scorer/config.json $P/config.json $S31 \
         $S33/val_avg3_t005/fidelity.json; do
  [ -f $f ] || { echo "beyond.sh: error: $f missing (run run.sh and ensemble_s33/run.sh first)" >&2; exit 2; }
done
ev() {  # scorer traces out [sample]
  local extra=(); [ "${4:-}" = sample ] && extra=(--policy-arg selection=sample --policy-arg temperature=0.005)
  [ -f $O/$3/fidelity.json ] || $PY -m foresight eval fidelity --model smollm2-135m --traces $2 \
    --policies learned --scorer $1 --budget 64 --interval 16 --batch-size 4 "${extra[@]}" --out $O/$3 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
F=fidelity.json:learned
mkdir -p $O
if [ "$1" = avg4 ]; then
  [ -f $O/avg4/config.json ] || $PY benchmarks/average_scorers.py --out $O/avg4 $P $R/round-3/scorer \
      $R/round-4/scorer $SL/scorer
  ev $O/avg4 $E/val_traces val_avg4_t005 sample & p1=$!; ev $O/avg4 $E/val_traces val_avg4_topk & p2=$!
  wait $p1; wait $p2
  { cmp $O/val_avg4_t005/$F $S33/val_avg3_t005/$F --by-problem --gap $S31:tova
    cmp $O/val_avg4_topk/$F $S33/val_avg3_topk/$F --by-problem --gap $S31:tova
  } | tee $O/avg4_validation_compare.txt
  exit 0
fi
tag=${1%-beyond}
X=$E/heldout_extra16_traces X3=$E/extra16x3_traces A=$E/aime/traces
ev $S $E/heldout_traces ${tag}_held_t005 sample & p1=$!; ev $S $E/heldout_traces ${tag}_held_topk & p2=$!; wait $p1; wait $p2
ev $S $X ${tag}_x16_t005 sample & p1=$!; ev $S $X ${tag}_x16_topk & p2=$!; wait $p1; wait $p2
ev $S $X3 ${tag}_x16x3_t005 sample & p1=$!; ev $S $X3 ${tag}_x16x3_topk & p2=$!; wait $p1; wait $p2
ev $S $A ${tag}_aime_t005 sample & p1=$!; ev $S $A ${tag}_aime_topk & p2=$!; wait $p1; wait $p2
GH=benchmarks/results/quality_B64_recipe336/quality.json:tova GX=benchmarks/results/quality_B64_recipe336/extra16/quality.json:tova
GA=benchmarks/results/quality_B64_aime/quality.json:tova Q3=benchmarks/results/extra16x3_s31/B64/quality.json:tova
{ for s in held x16 aime; do
    g=$GH; [ $s = x16 ] && g=$GX; [ $s = aime ] && g=$GA
    cmp $O/${tag}_${s}_t005/$F $S33/${s}_t005/$F --gap $g
    cmp $O/${tag}_${s}_topk/$F $S33/${s}_topk/$F --gap $g
  done
  cmp $O/${tag}_x16x3_t005/$F $S33/x16x3_t005/$F --gap $Q3 --by-problem
  cmp $O/${tag}_x16x3_topk/$F $S33/x16x3_topk/$F --gap $Q3 --by-problem
} | tee $O/${tag}_beyond_compare.txt
