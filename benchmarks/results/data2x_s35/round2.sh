#!/usr/bin/env bash
# session 35: run.sh's round 3 was killed for memory (the two ranks' round-3 training on 672 traces' rows of rounds
# 0-3: 12 GB anonymous memory each on this 23 GB machine, OOM killer), so its decision rule could not be applied.
# What is measurable: round 2 (SL + two rounds, 672 traces) on the validation traces, sampled at T=0.005 and top-k,
# paired by problem against round 2 of the one-sample recipe (session 32's rebuild, same seed 0; and session 34's
# seed-1 run). A reading, not the pre-registered decision. About 15 min on 2 cores. Outputs under $O; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s35}
D=$E/sl_B64_W16_prekey_data2x/rounds R0=$E/sl_B64_W16_prekey_r4/rounds R1=$E/sl_B64_W16_prekey_seed1/rounds
S31=benchmarks/results/temperature_s31/B64/quality.json
export OMP_NUM_THREADS=1
for f in $D/round-2/scorer/config.json $R0/round-2/scorer/config.json $R1/round-2/scorer/config.json $S31; do
  [ -f $f ] || { echo "round2.sh: error: $f missing (run run.sh, quality_B64_prekey_dagger/round4_s32.sh and ensemble_s34/run.sh first)" >&2; exit 2; }
done
ev() {  # scorer out [sample]
  local extra=(); [ "${3:-}" = sample ] && extra=(--policy-arg selection=sample --policy-arg temperature=0.005)
  [ -f $O/$2/fidelity.json ] || $PY -m foresight eval fidelity --model smollm2-135m --traces $E/val_traces \
    --policies learned --scorer $1 --budget 64 --interval 16 --batch-size 4 "${extra[@]}" --out $O/$2 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16 --by-problem --gap $S31:tova; }
mkdir -p $O
ev $D/round-2/scorer val_d2x_r2_t005 sample & p1=$!; ev $D/round-2/scorer val_d2x_r2_topk & p2=$!; wait $p1; wait $p2
ev $R0/round-2/scorer val_r4_r2_t005 sample & p1=$!; ev $R0/round-2/scorer val_r4_r2_topk & p2=$!; wait $p1; wait $p2
ev $R1/round-2/scorer val_s1_r2_t005 sample & p1=$!; ev $R1/round-2/scorer val_s1_r2_topk & p2=$!; wait $p1; wait $p2
F=fidelity.json:learned
{ echo "# two samples (672 traces) round 2 vs one sample round 2, seed 0 (session 32's rebuild)"
  cmp $O/val_d2x_r2_t005/$F $O/val_r4_r2_t005/$F
  cmp $O/val_d2x_r2_topk/$F $O/val_r4_r2_topk/$F
  echo "# vs one sample round 2, seed 1 (session 34)"
  cmp $O/val_d2x_r2_t005/$F $O/val_s1_r2_t005/$F
  cmp $O/val_d2x_r2_topk/$F $O/val_s1_r2_topk/$F
} | tee $O/round2_compare.txt
