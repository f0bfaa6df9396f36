#!/usr/bin/env bash
# session 51: finetune128.sh's recipe for the packaged B=64 scorer in its own cache (B=64/W=16; the exact mean of
# three SL + DAgger runs, top-k with spread 0.005 and age prior 0.01). Its members' DAgger rounds followed their
# bare top-k; here a round follows the scorer as it is deployed (age prior, spread), from the averaged scorer itself.
# Recipe (finetune128.sh's, unchanged; no sweep): the existing golden labels and features at B=64/W=16 of the 336
# training traces (the 8 validation problems held out, heldout=8), gap-weighted pairs, lr 0.002, 600 steps per round,
# round 0 on golden rows, one DAgger round at beta 0.5.
# Rule, written before any number of this script was read: round 1's scorer goes on to a check beyond the split only
# if, on the 48 1,024-cap validation traces at its recorded defaults, its paired (by problem) interval against the
# packaged B=64 default (benchmarks/results/s48/b64_topk_a01: top-k, spread 0.005, age prior 0.01) lies entirely
# below zero. Round 0 is printed beside it, no decision rides on it.
# About 30 min on 2 cores alone; every stage resumes.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s51}; R=benchmarks/results/s51
V=$E/val1024_traces Q=runs/s46/val1024/quality.json REF=benchmarks/results/s48/b64_topk_a01/fidelity.json:learned
for f in $E/golden_train_B64_W16/plan.json $V/plan.json $Q; do
  [ -f $f ] || { echo "s51/finetune64.sh: error: $f missing (run the recipe and long_s46/run.sh first)" >&2; exit 2; }
done
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
mkdir -p $O
stamp "fine-tuning: round 0 and one DAgger round"
SL=$O/ft64
E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 $SL init_scorer=smollm2-135m-b64-w16 hidden=48 lr=0.002 \
    steps=600 dagger_rounds=1
stamp "1,024-cap validation"
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
ev $SL/rounds/round-0/scorer $V $O/v64_r0 64 16 & p1=$!; ev $SL/rounds/round-1/scorer $V $O/v64_r1 64 16 & p2=$!
wait $p1; wait $p2
F=fidelity.json:learned
{ for r in r1 r0; do
    echo "# 1,024-cap validation: fine-tuned round ${r#r} - the packaged B=64 default (by problem)"
    $PY benchmarks/quality/compare.py $O/v64_$r/$F $REF --budget 64 --interval 16 --gap $Q:tova --by-problem
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q:tova --budget 64 --interval 16 $REF $O/v64_r0/$F \
      $O/v64_r1/$F
} > $R/finetune64.txt
cat $R/finetune64.txt
stamp done
