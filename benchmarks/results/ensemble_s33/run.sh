#!/usr/bin/env bash
# session 33: an ensemble of equally strong B=64 members (README "An ensemble of equally strong members ... is
# untried"): the packaged scorer (session 24's DAgger round 3) averaged with round 3 (and round 4) of session 32's
# rebuild of the same recipe (`quality_B64_prekey_dagger/rounds.sh`, runs/quality/sl_B64_W16_prekey_r4), by
# benchmarks/average_scorers.py (one scorer, the exact mean of the members' scores). Decision set, fixed before any
# number: session 31's validation traces (the 8 problems held out inside training, 6 traces each), sampled at the
# packaged T=0.005 and top-k, paired by problem against the packaged scorer alone. Only if an ensemble is better
# there (interval below zero) are the benchmark, the unused problems and AIME measured (STAGE=beyond).
# STAGE=temperature: avg3 sampled at T = 0.003 ... 0.01 on the validation traces. Outputs under $O (default
# runs/s33). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s33} R=runs/quality/sl_B64_W16_prekey_r4/rounds
P=benchmarks/results/quality_B64_prekey_dagger/scorer   # the packaged B=64 scorer of sessions 26-32
for f in $R/round-3/scorer/config.json $R/round-4/scorer/config.json $E/tsweep_B64/quality.json; do
  [ -f $f ] || { echo "ensemble_s33/run.sh: error: $f missing (run quality_B64_prekey_dagger/rounds.sh and temperature_s31/sweep.sh first)" >&2; exit 2; }
done
mkdir -p $O
[ -f $O/avg2/config.json ] || $PY benchmarks/average_scorers.py --out $O/avg2 $P $R/round-3/scorer
[ -f $O/avg3/config.json ] || $PY benchmarks/average_scorers.py --out $O/avg3 $P $R/round-3/scorer $R/round-4/scorer
ev() {  # scorer traces out [sample]
  local extra=(); [ "${4:-}" = sample ] && extra=(--policy-arg selection=sample --policy-arg temperature=0.005)
  [ -f $O/$3/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $2 \
    --policies learned --scorer $1 --budget 64 --interval 16 --batch-size 4 "${extra[@]}" --out $O/$3 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
echo "== $(date -u +%FT%TZ) validation"
ev $O/avg2 $E/val_traces val_avg2_t005 sample & p1=$!; ev $O/avg3 $E/val_traces val_avg3_t005 sample & p2=$!; wait $p1; wait $p2
ev $O/avg2 $E/val_traces val_avg2_topk & p1=$!; ev $O/avg3 $E/val_traces val_avg3_topk & p2=$!; wait $p1; wait $p2
G=$E/tsweep_B64/quality.json:tova
for a in avg2 avg3; do
  cmp $O/val_${a}_t005/fidelity.json:learned $E/tsweep_B64/quality.json:t005 --by-problem --gap $G
  cmp $O/val_${a}_topk/fidelity.json:learned $E/tsweep_B64/quality.json:topk --by-problem --gap $G
done
if [ "${STAGE:-}" = temperature ]; then  # after the decision: is T=0.005 (the packaged member's) right for avg3?
  echo "== $(date -u +%FT%TZ) avg3's temperature on the validation traces"
  for t in 0.003 0.004 0.007 0.01; do
    [ -f $O/val_avg3_t${t#0.}/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m \
      --traces $E/val_traces --policies learned --scorer $O/avg3 --budget 64 --interval 16 --batch-size 4 \
      --policy-arg selection=sample --policy-arg temperature=$t --out $O/val_avg3_t${t#0.} --quiet
  done
  for t in 003 004 007 01; do
    echo "T=0.$t vs T=0.005:"; cmp $O/val_avg3_t$t/fidelity.json:learned $O/val_avg3_t005/fidelity.json:learned --by-problem --gap $G
  done
  exit 0
fi
[ "${STAGE:-}" = beyond ] || { echo "== $(date -u +%FT%TZ) done (STAGE=beyond or temperature for more)"; exit 0; }
# beyond the decision set: avg3 (the one ensemble better at both selections on validation) on the 48 benchmark
# traces, the 16 unused problems (seed 0, and 3 more traces each) and the 60 AIME traces, paired per trace with
# the packaged scorer's committed runs on the same traces (compare.py checks tokens and full-cache CE)
echo "== $(date -u +%FT%TZ) beyond"
X=$E/heldout_extra16_traces X3=$E/extra16x3_traces A=$E/aime/traces
ev $O/avg3 $E/heldout_traces held_t005 sample & p1=$!; ev $O/avg3 $E/heldout_traces held_topk & p2=$!; wait $p1; wait $p2
ev $O/avg3 $X x16_t005 sample & p1=$!; ev $O/avg3 $X x16_topk & p2=$!; wait $p1; wait $p2
ev $O/avg3 $X3 x16x3_t005 sample & p1=$!; ev $O/avg3 $X3 x16x3_topk & p2=$!; wait $p1; wait $p2
ev $O/avg3 $A aime_t005 sample & p1=$!; ev $O/avg3 $A aime_topk & p2=$!; wait $p1; wait $p2
PY=$PY bash benchmarks/quality/beyond_vs_recipe_r3.sh $O | tee $O/beyond_compare.txt
echo "== $(date -u +%FT%TZ) done"
