#!/usr/bin/env bash
# session 38 (issue 13): transfer rows for the adapter of the second alternation cycle (adapt_s37c3, alt2.sh in
# ../adapt_B64_W16_s37/), the adapter of the system that met the target: {base, adapted} x {h2o, lazy} at B=64/W=16
# and {learned (the packaged B=128 scorer, never trained under: --other-scorer), h2o, lazy} at B=128/W=32, on the
# benchmark's 48 held-out traces (47 reach B=128), top-k, each model against its own full cache, paired per trace.
# As ../adapt_B64_W16_s37/transfer.sh did for session 30's adapter. Reported as measured; no decision rests on it.
# About 16 min on 2 cores alone; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}; PY=${PY:-.venv/bin/python}; A=$E/adapt_s37c3_B64/adapter R=benchmarks/results/adapt_B64_W16_s38
export OMP_NUM_THREADS=1
[ -f $A/adapter_config.json ] || { echo "adapt_B64_W16_s38/transfer.sh: error: $A missing (run adapt_B64_W16_s37/alt2.sh first)" >&2; exit 2; }
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
measure() {  # out dir, extra args
  local out=$1; shift
  [ -f $out/adapt_eval.json ] || $PY benchmarks/adapt_eval.py --adapter $A --traces $E/heldout_traces --out $out "$@"
}
stamp "measure"
measure $E/adapt_s38_transfer_B64 --policies h2o,lazy --budget 64 --interval 16 \
  > $E/adapt_s38_transfer_B64.log 2>&1 & p1=$!
measure $E/adapt_s38_transfer_B128 --policies learned,h2o,lazy --scorer smollm2-135m-b128-w32 --other-scorer \
  --budget 128 --interval 32 > $E/adapt_s38_transfer_B128.log 2>&1 & p2=$!
wait $p1; wait $p2
for b in 64 128; do
  cp $E/adapt_s38_transfer_B$b/adapt_eval.json $R/transfer_B$b.json; cp $E/adapt_s38_transfer_B$b/adapt_eval.md $R/transfer_B$b.md
done
stamp done
