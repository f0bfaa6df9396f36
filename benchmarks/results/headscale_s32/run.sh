#!/usr/bin/env bash
# session 32: sampled selection with per-head standardised scores vs one temperature, on session 31's validation
# traces (benchmarks/results/temperature_s31/sweep.sh makes them and the tsweep_B* runs), both budgets side by
# side (about 28 min on 2 cores). Outputs: headscale_B64.json, headscale_B128.json and their printed tables.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; R=benchmarks/results/headscale_s32
export OMP_NUM_THREADS=1
run() {  # B W scorer T reference-stage
  [ -f $R/headscale_B$1.json ] || $PY $R/headscale.py --traces $E/val_traces --scorer $3 --budget $1 --interval $2 \
    --temperature $4 --taus 0.1,0.15,0.2,0.3 --reference $E/tsweep_B$1/quality.json:$5 --out $R/headscale_B$1.json \
    > $R/headscale_B$1.txt
}
run 64 16 benchmarks/results/quality_B64_prekey_dagger/scorer 0.005 t005 & p1=$!
run 128 32 benchmarks/results/s50/b128_s41 0.003 t003 & p2=$!
wait $p1 && wait $p2
cat $R/headscale_B64.txt $R/headscale_B128.txt
