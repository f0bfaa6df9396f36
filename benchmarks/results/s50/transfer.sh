#!/usr/bin/env bash
# session 50, exploration on the 1,024-cap validation traces (the split a knob is chosen on; no default changes
# here). The packaged B=128 scorer closes 49.6% of the tova -> golden gap there and the B=64 one 64.0% at its own
# budget: the B=128 scorer saw few eviction events per training trace (evictions start at 128 tokens, one every 32),
# the B=64 one four times as many, in caches whose ages run longer relative to B. Here the packaged B=64 scorer runs
# in the B=128/W=32 cache (`any_budget=true`, a deliberate transfer: its recent-query window stays 16), top-k at its
# recorded defaults (spread 0.005, age prior 0.01) and with age_prior=0, paired by problem against the B=128 default.
# About 25 min on 2 cores alone. Every evaluation resumes (skipped when done).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s50}; R=benchmarks/results/s50
V=$E/val1024_traces Q128=runs/s47/val1024_b128/quality.json
for f in $V/plan.json $Q128; do
  [ -f $f ] || { echo "s50/transfer.sh: error: $f missing (run long_s46 and long_s47 first)" >&2; exit 2; }
done
mkdir -p $O
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
S64=smollm2-135m-b64-w16
ev $S64 $V $O/v128_x64 128 32 --policy-arg any_budget=true & p1=$!
ev $S64 $V $O/v128_x64_a0 128 32 --policy-arg any_budget=true --policy-arg age_prior=0 & p2=$!
wait $p1; wait $p2
F=fidelity.json:learned
C() { $PY benchmarks/quality/compare.py "$@" --by-problem; }
{ for s in x64 x64_a0; do
    echo "# B=128, 1,024-cap validation: the B=64 scorer ($s) - the packaged B=128 default"
    C $O/v128_$s/$F $Q128:def --budget 128 --interval 32 --gap $Q128:tova
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $O/v128_x64/$F $O/v128_x64_a0/$F
} > $R/transfer.txt
cat $R/transfer.txt
