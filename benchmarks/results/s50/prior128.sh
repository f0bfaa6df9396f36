#!/usr/bin/env bash
# session 50, exploration on the 1,024-cap validation traces (the split a knob is chosen on; no default changes
# here). The packaged B=128 scorer is, since this session, the B=64 scorer moved to the B=128/W=32 cache with the B=64
# top-k defaults (spread 0.005, age prior 0.01), none tuned at B=128. Its age prior at 0.005 and 0.02, paired by
# problem against the default (s50/transfer.sh's v128_x64 run, the same evictions). About 12 min on 2 cores alone.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s50}; R=benchmarks/results/s50
V=$E/val1024_traces Q128=runs/s47/val1024_b128/quality.json
for f in $V/plan.json $Q128 $O/v128_x64/fidelity.json; do
  [ -f $f ] || { echo "s50/prior128.sh: error: $f missing (run long_s46, long_s47 and s50/transfer.sh first)" >&2; exit 2; }
done
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh smollm2-135m-b128-w32 $V "$@"; }
ev $O/v128_a005 128 32 --policy-arg age_prior=0.005 & p1=$!; ev $O/v128_a02 128 32 --policy-arg age_prior=0.02 & p2=$!
wait $p1; wait $p2
F=fidelity.json:learned
{ for a in a005 a02; do
    echo "# B=128, 1,024-cap validation: the packaged scorer with age prior ${a/a/0.} - its default (age prior 0.01)"
    $PY benchmarks/quality/compare.py $O/v128_$a/$F $O/v128_x64/$F --budget 128 --interval 32 --gap $Q128:tova \
        --by-problem
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $O/v128_x64/$F $O/v128_a005/$F $O/v128_a02/$F
} > $R/prior128.txt
cat $R/prior128.txt
