#!/usr/bin/env bash
# session 38 (issue 13): transfer rows for the adapter of the second alternation cycle (adapt_s37c3, alt2.sh in
# ../adapt_B64_W16_s37/), the adapter of the system that met the target: {base, adapted} x {h2o, lazy} at B=64/W=16
# and {learned (the packaged B=128 scorer, never trained under: --other-scorer), h2o, lazy} at B=128/W=32, on the
# benchmark's 48 held-out traces (47 reach B=128), top-k, each model against its own full cache, paired per trace:
# ../adapt_B64_W16_s37/transfer.sh for this adapter. Reported as measured; no decision rests on it. About 16 min on
# 2 cores alone; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}
A=$E/adapt_s37c3_B64/adapter T=s38 R=benchmarks/results/adapt_B64_W16_s38 exec bash benchmarks/results/adapt_B64_W16_s37/transfer.sh
