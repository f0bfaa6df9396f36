#!/usr/bin/env bash
# session 51: the exact mean (benchmarks/average_scorers.py; hidden units concatenated) of the packaged B=128 scorer
# and finetune128's rounds 1 and 2, each level with it on the 1,024-cap validation traces (finetune128.txt,
# finetune128_r2.txt); round 0, worse there, is left out (a choice made on those numbers, said here). Session 33's
# B=64 ensemble of three runs was ahead of each member; these members share one start, so their errors may not
# average out. Rule, written before any number of this script was read: the ensemble goes on to check128.sh (with
# S=runs/s51/ens128; its rule unchanged) only if, on the 48 1,024-cap validation traces at its recorded defaults
# (top-k, spread 0.005, age prior 0.01, the members' own), its paired (by problem) interval against the packaged
# B=128 scorer lies entirely below zero. About 12 min on one core.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s51}; R=benchmarks/results/s51
V=$E/val1024_traces Q=runs/s47/val1024_b128/quality.json REF=runs/s50/v128_x64/fidelity.json:learned SL=$O/ft128
[ -f $SL/rounds/round-2/summary.json ] || { echo "s51/ensemble128.sh: error: run finetune128_r2.sh first" >&2; exit 2; }
[ -d $O/ens128 ] || $PY benchmarks/average_scorers.py --out $O/ens128 smollm2-135m-b128-w32 \
    $SL/rounds/round-1/scorer $SL/rounds/round-2/scorer
PY=$PY bash benchmarks/quality/eval_learned.sh $O/ens128 $V $O/v_ens 128 32
F=fidelity.json:learned
{ echo "# 1,024-cap validation: the ensemble - the packaged B=128 default (by problem)"
  $PY benchmarks/quality/compare.py $O/v_ens/$F $REF --budget 128 --interval 32 --gap $Q:tova --by-problem
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q:tova --budget 128 --interval 32 $REF $O/v_r1/$F \
      $O/v_r2/$F $O/v_ens/$F
} > $R/ensemble128.txt
cat $R/ensemble128.txt
