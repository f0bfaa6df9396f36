#!/usr/bin/env bash
# session 50, exploration on the 1,024-cap validation traces (the split a knob is chosen on; no default changes
# here). Session 28's B=128 scorer gained from top-k's newcomer bonus 0.012 (session 41: its default until session 49);
# the packaged B=128 scorer (the B=64 scorer moved to B=128/W=32) records none, as B=64 does (there it missed its rule).
# Here the moved scorer with newcomer_bonus 0.006 and 0.012 on top of its defaults (spread 0.005, age prior 0.01),
# paired by problem against its default (s50/transfer.sh's v128_x64 run, the same evictions). ~12 min on 2 cores alone.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s50}; R=benchmarks/results/s50
V=$E/val1024_traces Q128=runs/s47/val1024_b128/quality.json
for f in $V/plan.json $Q128 $O/v128_x64/fidelity.json; do
  [ -f $f ] || { echo "s50/newcomer128.sh: error: $f missing (run long_s46, long_s47 and s50/transfer.sh first)" >&2; exit 2; }
done
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh smollm2-135m-b128-w32 $V "$@"; }
ev $O/v128_nb006 128 32 --policy-arg newcomer_bonus=0.006 & p1=$!
ev $O/v128_nb012 128 32 --policy-arg newcomer_bonus=0.012 & p2=$!; wait $p1; wait $p2
F=fidelity.json:learned
{ for b in 006 012; do
    echo "# B=128, 1,024-cap validation: the packaged scorer with newcomer bonus 0.$b - its default (none)"
    $PY benchmarks/quality/compare.py $O/v128_nb$b/$F $O/v128_x64/$F --budget 128 --interval 32 --gap $Q128:tova \
        --by-problem
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $O/v128_x64/$F $O/v128_nb006/$F $O/v128_nb012/$F
} > $R/newcomer128.txt
cat $R/newcomer128.txt
