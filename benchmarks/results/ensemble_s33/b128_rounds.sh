#!/usr/bin/env bash
# session 33: a second B=128 run of the packaged scorer's recipe (benchmarks/quality/recipe.sh with B=128 W=32: SL
# 2,400 steps + DAgger at beta 0.5, pre-RoPE features), data-order/initialisation seed 1 and four rounds, so that its
# rounds 3 and 4 and the packaged scorer make a three-member ensemble like the B=64 one (run.sh). Then the same
# decision as at B=64, fixed before any number: the ensemble is measured on session 31's validation traces against
# the packaged scorer alone, sampled at the packaged T=0.003 and top-k, paired by problem.
# About 1.5 h on 2 cores alone (session 33: labels 2 min, features 10, SL 5, rounds 11-25 min each). Every stage
# resumes when rerun.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s33} SL=runs/quality/sl_B128_W32_prekey_seed1
P=benchmarks/results/s50/b128_s41
export OMP_NUM_THREADS=1
for f in $E/train_traces/plan.json $E/golden_val_B128_W32/plan.json $E/tsweep_B128/quality.json; do
  [ -f $f ] || { echo "b128_rounds.sh: error: $f missing (run benchmarks/quality/recipe.sh's trace stages and temperature_s31/sweep.sh first)" >&2; exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "golden labels B=128 W=32"
two_ranks $PY -m foresight golden --traces $E/train_traces --out $E/golden_train_B128_W32 --budget 128 --interval 32 --no-progress
stamp "SL + 4 DAgger rounds, seed 1"
[ -f $SL/scorer/config.json ] || E=$E PY=$PY PORT=29813 bash benchmarks/quality/train_sl.sh 128 32 $SL seed=1 dagger_rounds=4
stamp "ensemble and validation"
mkdir -p $O
[ -f $O/avg3_b128/config.json ] || $PY benchmarks/average_scorers.py --out $O/avg3_b128 $P \
    $SL/rounds/round-3/scorer $SL/rounds/round-4/scorer
ev() {  # out [sample]
  local extra=(); [ "${2:-}" = sample ] && extra=(--policy-arg selection=sample --policy-arg temperature=0.003)
  [ -f $O/$1/fidelity.json ] || $PY -m foresight eval fidelity --model smollm2-135m --traces $E/val_traces \
    --policies learned --scorer $O/avg3_b128 --budget 128 --interval 32 --batch-size 4 "${extra[@]}" --out $O/$1 --quiet
}
ev val128_avg3_t003 sample & p1=$!; ev val128_avg3_topk & p2=$!; wait $p1; wait $p2
C="$PY benchmarks/quality/compare.py" Q=$E/tsweep_B128/quality.json
$C $O/val128_avg3_t003/fidelity.json:learned $Q:t003 --budget 128 --interval 32 --by-problem --gap $Q:tova
$C $O/val128_avg3_topk/fidelity.json:learned $Q:topk --budget 128 --interval 32 --by-problem --gap $Q:tova
stamp done
