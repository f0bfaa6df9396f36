#!/usr/bin/env bash
# session 34: does the B=64 ensemble gain grow with members? A second run of the packaged members' recipe
# (quality_B64_prekey_dagger/rounds.sh: SL 2,400 steps + four DAgger rounds at beta 0.5 halved each round, pre-RoPE
# features) with data-order/initialisation seed 1 (split_seed unchanged, so the 8 validation problems stay held out),
# into runs/quality/sl_B64_W16_prekey_seed1; then avg5 = the exact mean of the packaged ensemble's three members and
# this run's rounds 3 and 4 (benchmarks/average_scorers.py; every member weighted equally).
# Decision rule, fixed before any number: avg5 replaces the packaged avg3 only if, on session 31's validation traces
# (paired by problem against avg3's committed runs in ../ensemble_s33), both selections (sampled at T=0.005 and
# top-k) point lower and at least one interval is below zero. Only then STAGE=beyond measures the other sets.
# About 1.5 h on 2 cores alone (session 32: SL 16 min, rounds 17-20 min each). Every stage resumes when rerun.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s34} SL=runs/quality/sl_B64_W16_prekey_seed1
R=runs/quality/sl_B64_W16_prekey_r4/rounds P=benchmarks/results/quality_B64_prekey_dagger/scorer
S33=benchmarks/results/ensemble_s33
export OMP_NUM_THREADS=1
for f in $E/train_traces/plan.json $E/golden_train_B64_W16/plan.json $R/round-3/scorer/config.json \
         $R/round-4/scorer/config.json $E/tsweep_B64/quality.json $S33/val_avg3_t005/fidelity.json; do
  [ -f $f ] || { echo "ensemble_s34/run.sh: error: $f missing (run quality_B64_prekey_dagger/rounds.sh, temperature_s31/sweep.sh and ensemble_s33/run.sh first)" >&2; exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "SL + 4 DAgger rounds, seed 1"
[ -f $SL/scorer/config.json ] || E=$E PY=$PY PORT=29814 bash benchmarks/quality/train_sl.sh 64 16 $SL seed=1 dagger_rounds=4
stamp "ensemble and validation"
mkdir -p $O
[ -f $O/avg5/config.json ] || $PY benchmarks/average_scorers.py --out $O/avg5 $P $R/round-3/scorer $R/round-4/scorer \
    $SL/rounds/round-3/scorer $SL/rounds/round-4/scorer
ev() {  # scorer traces out [sample]
  local extra=(); [ "${4:-}" = sample ] && extra=(--policy-arg selection=sample --policy-arg temperature=0.005)
  [ -f $O/$3/fidelity.json ] || $PY -m foresight eval fidelity --model smollm2-135m --traces $2 \
    --policies learned --scorer $1 --budget 64 --interval 16 --batch-size 4 "${extra[@]}" --out $O/$3 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
ev $O/avg5 $E/val_traces val_avg5_t005 sample & p1=$!; ev $O/avg5 $E/val_traces val_avg5_topk & p2=$!; wait $p1; wait $p2
G=$E/tsweep_B64/quality.json:tova F=fidelity.json:learned
{ cmp $O/val_avg5_t005/$F $S33/val_avg3_t005/$F --by-problem --gap $G
  cmp $O/val_avg5_topk/$F $S33/val_avg3_topk/$F --by-problem --gap $G
} | tee $O/validation_compare.txt
[ "${STAGE:-}" = beyond ] || { stamp "done (STAGE=beyond for the other sets)"; exit 0; }
stamp beyond
X=$E/heldout_extra16_traces X3=$E/extra16x3_traces A=$E/aime/traces
ev $O/avg5 $E/heldout_traces held_t005 sample & p1=$!; ev $O/avg5 $E/heldout_traces held_topk & p2=$!; wait $p1; wait $p2
ev $O/avg5 $X x16_t005 sample & p1=$!; ev $O/avg5 $X x16_topk & p2=$!; wait $p1; wait $p2
ev $O/avg5 $X3 x16x3_t005 sample & p1=$!; ev $O/avg5 $X3 x16x3_topk & p2=$!; wait $p1; wait $p2
ev $O/avg5 $A aime_t005 sample & p1=$!; ev $O/avg5 $A aime_topk & p2=$!; wait $p1; wait $p2
GH=benchmarks/results/quality_B64_recipe336/quality.json:tova GX=benchmarks/results/quality_B64_recipe336/extra16/quality.json:tova
GA=benchmarks/results/quality_B64_aime/quality.json:tova Q3=benchmarks/results/extra16x3_s31/B64/quality.json:tova
{ for s in held x16 aime; do
    g=$GH; [ $s = x16 ] && g=$GX; [ $s = aime ] && g=$GA
    cmp $O/${s}_t005/$F $S33/${s}_t005/$F --gap $g
    cmp $O/${s}_topk/$F $S33/${s}_topk/$F --gap $g
  done
  cmp $O/x16x3_t005/$F $S33/x16x3_t005/$F --gap $Q3 --by-problem
  cmp $O/x16x3_topk/$F $S33/x16x3_topk/$F --gap $Q3 --by-problem
} | tee $O/beyond_compare.txt
stamp done
