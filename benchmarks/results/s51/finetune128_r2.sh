#!/usr/bin/env bash
# session 51: a second DAgger round for finetune128.sh's run. finetune128.txt: round 0 (golden rows only) was worse
# than the packaged B=128 scorer on the 1,024-cap validation traces (+0.0067 [-0.0046, +0.0205]), round 1 (its own
# rows added) level (-0.0010 [-0.0064, +0.0040]): the on-policy rows carry the fine-tuning, so a round more of them.
# `--resume` with dagger_rounds=2 extends the finished run (round 2 records the trajectory of round 1's scorer at
# beta 0.25 and retrains from the packaged scorer on golden + round 1 + round 2 rows); nothing else changes.
# Rule, written before any number of this script was read: round 2's scorer goes on to check128.sh (with
# S=runs/s51/ft128/rounds/round-2/scorer; its rule unchanged) only if, on the 48 1,024-cap validation traces at its
# recorded defaults, its paired (by problem) interval against the packaged B=128 scorer lies entirely below zero.
# About 25 min on 2 cores alone; every stage resumes.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s51}; R=benchmarks/results/s51
V=$E/val1024_traces Q=runs/s47/val1024_b128/quality.json REF=runs/s50/v128_x64/fidelity.json:learned SL=$O/ft128
[ -f $SL/rounds/round-1/summary.json ] || { echo "s51/finetune128_r2.sh: error: run finetune128.sh first" >&2; exit 2; }
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "DAgger round 2"
E=$E PY=$PY bash benchmarks/quality/train_sl.sh 128 32 $SL init_scorer=smollm2-135m-b128-w32 hidden=48 lr=0.002 \
    steps=600 dagger_rounds=2
stamp "1,024-cap validation"
PY=$PY bash benchmarks/quality/eval_learned.sh $SL/rounds/round-2/scorer $V $O/v_r2 128 32
F=fidelity.json:learned
{ echo "# 1,024-cap validation: fine-tuned round 2 - the packaged B=128 default (by problem)"
  $PY benchmarks/quality/compare.py $O/v_r2/$F $REF --budget 128 --interval 32 --gap $Q:tova --by-problem
  echo "# 1,024-cap validation: fine-tuned round 2 - round 1 (by problem)"
  $PY benchmarks/quality/compare.py $O/v_r2/$F $O/v_r1/$F --budget 128 --interval 32 --gap $Q:tova --by-problem
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q:tova --budget 128 --interval 32 $REF $O/v_r1/$F $O/v_r2/$F
} > $R/finetune128_r2.txt
cat $R/finetune128_r2.txt
stamp done
