#!/usr/bin/env bash
# session 49, exploration on the 1,024-cap validation traces (the split a knob is chosen on; no default changes
# here). Session 48's age_prior subtracts lam * log1p(age): its slope is steepest among the young, so at B=128 it
# moved the long traces from 36% to 53% of the gap and cost as much on the short ones, and at B=64 it lost a few
# points under 300 tokens. A sampled draw's hazard is per event, so an entry's survival decays with the events it lived
# through: the deterministic counterpart is a prior *linear* in that count. The learned policy's `age_slope=s` (new)
# subtracts s * age / W. Here: s = 0.001 / 0.003 at B=64 (top-k, spread 0.005) and at B=128 (its default
# top-k), paired by problem against plain top-k, the packaged defaults and session 48's age_prior 0.01.
# B=64 gives age_prior=0: the packaged scorer records 0.01 as its top-k default since this session's export.
# About 60 min on 2 cores alone. Every evaluation resumes (skipped when done).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s49}; R=benchmarks/results/s49
V=$E/val1024_traces Q64=runs/s46/val1024/quality.json Q128=runs/s47/val1024_b128/quality.json S48=runs/s48
for f in $V/plan.json $Q64 $Q128 $S48/b64_topk/fidelity.json $S48/b64_topk_a01/fidelity.json $S48/b128_a01/fidelity.json; do
  [ -f $f ] || { echo "s49/slope.sh: error: $f missing (run long_s46, long_s47 and s48/run.sh first)" >&2; exit 2; }
done
mkdir -p $O
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
S64=smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41 SL="001 003"
for s in $SL; do
  ev $S64 $V $O/v64_s$s 64 16 --policy-arg selection=topk --policy-arg age_prior=0 --policy-arg age_slope=0.$s & p1=$!
  ev $S128 $V $O/v128_s$s 128 32 --policy-arg age_slope=0.$s & p2=$!; wait $p1; wait $p2
done
F=fidelity.json:learned
C() { $PY benchmarks/quality/compare.py "$@" --by-problem; }
{ for s in $SL; do
    echo "# B=64, 1,024-cap validation: top-k with age_slope 0.$s - plain top-k"
    C $O/v64_s$s/$F $S48/b64_topk/$F --budget 64 --interval 16 --gap $Q64:tova
    echo "# B=64: top-k with age_slope 0.$s - the packaged default (sampled T=0.005)"
    C $O/v64_s$s/$F $Q64:avg3 --budget 64 --interval 16 --gap $Q64:tova
    echo "# B=64: top-k with age_slope 0.$s - top-k with age_prior 0.01 (session 48)"
    C $O/v64_s$s/$F $S48/b64_topk_a01/$F --budget 64 --interval 16 --gap $Q64:tova
    echo "# B=128: default top-k with age_slope 0.$s - without"
    C $O/v128_s$s/$F $Q128:def --budget 128 --interval 32 --gap $Q128:tova
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q64:tova --budget 64 --interval 16 $Q64:avg3 \
      $S48/b64_topk/$F $S48/b64_topk_a01/$F $(for s in $SL; do echo $O/v64_s$s/$F; done)
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $S48/b128_a01/$F $(for s in $SL; do echo $O/v128_s$s/$F; done)
} > $R/slope.txt
cat $R/slope.txt
