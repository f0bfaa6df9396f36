#!/usr/bin/env bash
# session 44, after run.sh and cost.py (a diagnostic; no decision rides on it, the rule already failed): the boundary
# scorer's row scores spread 1.4x wider than the gap scorer's (cost.py: median row std 0.040 vs 0.028 at round 3), so
# T=0.005 samples it relatively colder, nearer its top-k. Does it match the recipe at a temperature scaled to its spread
# (0.005 x 1.4 = 0.007), or at 0.01? Boundary round 3 on the 48 validation traces, paired by problem with the recipe's
# round 3 sampled at its T=0.005.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s44} R=benchmarks/results/boundary_s44
S=$O/boundary/rounds/round-3/scorer Q=benchmarks/results/temperature_s31/B64/quality.json
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh $S $E/val_traces $O/v_r3_t$1 64 16 \
    --policy-arg selection=sample --policy-arg temperature=0.$1; }
ev 007 & p1=$!; ev 01 & p2=$!; wait $p1; wait $p2
for t in 007 01; do
  echo "# boundary round 3 at T=0.$t - recipe round 3 at T=0.005"
  $PY benchmarks/quality/compare.py $O/v_r3_t$t/fidelity.json:learned $Q:t005 --budget 64 --interval 16 --by-problem \
      --gap $Q:tova
done | tee $R/temperature_compare.txt
