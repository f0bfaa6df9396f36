#!/usr/bin/env bash
# session 37 (issue 13): does session 30's cycle-2 adapter (adapt_s30b, trained under `learned` at B=64/W=16 with the
# scorer packaged in sessions 26-32) transfer to policies and a budget it was not trained under? Issue 13 asks for
# {base, adapted} x {h2o, lazy, learned} at B=64/W=16 and B=128/W=32; until now only session 13's adapter had these
# rows. Measured on the benchmark's 48 held-out traces (47 reach B=128), top-k, each model against its own full
# cache, paired per trace (adapt_eval.py). `learned` at B=64 is avg3.sh's / session 34's; here h2o and lazy at B=64,
# and learned (the packaged B=128 scorer, which the adapter never saw: --other-scorer), h2o and lazy at B=128.
# Reported as measured; no decision rests on it. About 20 min on 2 cores alone; rerun to resume.
# Another adapter: A=<adapter dir> T=<tag of the run dirs> R=<results dir> (../adapt_B64_W16_s38/transfer.sh).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}; PY=${PY:-.venv/bin/python}; A=${A:-$E/adapt_s30b_B64/adapter}
R=${R:-benchmarks/results/adapt_B64_W16_s37} T=${T:-s37}
export OMP_NUM_THREADS=1
[ -f $A/adapter_config.json ] || { echo "adapt_B64_W16_s37/transfer.sh: error: $A missing (train it first)" >&2; exit 2; }
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
measure() {  # out dir, extra args
  local out=$1; shift
  [ -f $out/adapt_eval.json ] || $PY benchmarks/adapt_eval.py --adapter $A --traces $E/heldout_traces --out $out "$@"
}
stamp "measure"
measure $E/adapt_${T}_transfer_B64 --policies h2o,lazy --budget 64 --interval 16 \
  > $E/adapt_${T}_transfer_B64.log 2>&1 & p1=$!
measure $E/adapt_${T}_transfer_B128 --policies learned,h2o,lazy --scorer benchmarks/results/s50/b128_s41 --other-scorer \
  --budget 128 --interval 32 > $E/adapt_${T}_transfer_B128.log 2>&1 & p2=$!
wait $p1; wait $p2
for b in 64 128; do
  cp $E/adapt_${T}_transfer_B$b/adapt_eval.json $R/transfer_B$b.json; cp $E/adapt_${T}_transfer_B$b/adapt_eval.md $R/transfer_B$b.md
done
stamp done
