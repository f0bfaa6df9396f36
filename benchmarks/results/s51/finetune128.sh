#!/usr/bin/env bash
# session 51: fine-tune the packaged B=128 scorer (the B=64 weights moved to B=128/W=32 in session 50; recent-query
# window 16, top-k with spread 0.005 and age prior 0.01) in its own cache, with on-policy rows (DAgger).
# Session 50 left B=128 at the 60% line beyond the split (59.9% pooled) with the 1,024-cap validation traces its
# weakest set (53.6%), and the scorer was never trained at B=128: these weights learned at B=64/W=16 only.
# `foresight train sl init_scorer=...` (new) starts every round from it (its weights and standardisation), builds its
# window-16 features, and a round's rollouts act as the learned policy deploys it (age prior, spread).
# Recipe (chosen before any number; no sweep): golden labels at B=128/W=32 for the 336 training traces (the 8
# validation problems stay held out, heldout=8 as in the recipe), gap-weighted pairs, lr 0.002 (a fifth of the
# recipe's), 600 steps per round, round 0 on golden rows, one DAgger round at beta 0.5.
# Rule, written before any number of this script was read: the candidate is round 1's scorer (round 0 is printed
# beside it, no decision rides on it). It goes on to the check beyond the split (check128.sh, its rule committed with
# this script) only if, on the 48 1,024-cap validation traces at its recorded defaults, its paired (by problem)
# interval against the packaged B=128 default (runs/s50/v128_x64) lies entirely below zero.
# About 80 min on 2 cores alone (labels 6, features 10, round 0 5, round 1 35, evaluations 25); every stage resumes.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s51}; R=benchmarks/results/s51
V=$E/val1024_traces Q=runs/s47/val1024_b128/quality.json REF=runs/s50/v128_x64/fidelity.json:learned
for f in $E/train_traces/plan.json $V/plan.json $Q runs/s50/v128_x64/fidelity.json; do
  [ -f $f ] || { echo "s51/finetune128.sh: error: $f missing (run long_s47/run.sh and s50/transfer.sh first)" >&2; exit 2; }
done
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
mkdir -p $O
stamp "golden labels B=128 W=32"
two_ranks $PY -m foresight golden --traces $E/train_traces --out $E/golden_train_B128_W32 --budget 128 --interval 32 \
    --no-progress
stamp "fine-tuning: round 0 and one DAgger round"
SL=$O/ft128
E=$E PY=$PY bash benchmarks/quality/train_sl.sh 128 32 $SL init_scorer=smollm2-135m-b128-w32 hidden=48 lr=0.002 \
    steps=600 dagger_rounds=1
stamp "1,024-cap validation"
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
ev $SL/rounds/round-0/scorer $V $O/v_r0 128 32 & p1=$!; ev $SL/rounds/round-1/scorer $V $O/v_r1 128 32 & p2=$!
wait $p1; wait $p2
F=fidelity.json:learned
{ for r in r1 r0; do
    echo "# 1,024-cap validation: fine-tuned round ${r#r} - the packaged B=128 default (by problem)"
    $PY benchmarks/quality/compare.py $O/v_$r/$F $REF --budget 128 --interval 32 --gap $Q:tova --by-problem
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q:tova --budget 128 --interval 32 $REF $O/v_r0/$F $O/v_r1/$F
} > $R/finetune128.txt
cat $R/finetune128.txt
stamp done
