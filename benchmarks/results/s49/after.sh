#!/usr/bin/env bash
# session 49, exploration on the 1,024-cap validation traces (no default changes here). gate.txt: the age prior's
# gain on long traces comes from its tilt among young entries, and at B=128 that tilt costs short traces as much
# (under 300 tokens 87% -> 76% of the gap) as it gains on long ones (36% -> 53%). `age_prior_after=t0` (new) applies
# the prior only once a trace is t0 tokens long, so shorter traces are ranked as trained. Here B=128 (its default
# top-k) with lam 0.01 after 512, and B=64 top-k with lam 0.02 (0.01, its default since this session, was the grid's
# edge), paired by problem against each default. About 15 min on 2 cores. Every evaluation resumes.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s49}; R=benchmarks/results/s49
V=$E/val1024_traces Q64=runs/s46/val1024/quality.json Q128=runs/s47/val1024_b128/quality.json S48=runs/s48
for f in $V/plan.json $Q64 $Q128 $S48/b64_topk_a01/fidelity.json $S48/b128_a01/fidelity.json; do
  [ -f $f ] || { echo "s49/after.sh: error: $f missing (run long_s46, long_s47 and s48/run.sh first)" >&2; exit 2; }
done
mkdir -p $O
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
S64=smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
ev $S128 $V $O/v128_a01_after512 128 32 --policy-arg age_prior=0.01 --policy-arg age_prior_after=512 & p1=$!
ev $S64 $V $O/v64_a02 64 16 --policy-arg selection=topk --policy-arg age_prior=0.02 & p2=$!; wait $p1; wait $p2
F=fidelity.json:learned
C() { $PY benchmarks/quality/compare.py "$@" --by-problem; }
{ echo "# B=128, 1,024-cap validation: default top-k with age_prior 0.01 after 512 - the default (no prior)"
  C $O/v128_a01_after512/$F $Q128:def --budget 128 --interval 32 --gap $Q128:tova
  echo "# B=128: age_prior 0.01 after 512 - age_prior 0.01 at every event (session 48)"
  C $O/v128_a01_after512/$F $S48/b128_a01/$F --budget 128 --interval 32 --gap $Q128:tova
  echo "# B=64: top-k with age_prior 0.02 - with 0.01 (this session's default; session 48's run)"
  C $O/v64_a02/$F $S48/b64_topk_a01/$F --budget 64 --interval 16 --gap $Q64:tova
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q64:tova --budget 64 --interval 16 $Q64:avg3 \
      $S48/b64_topk_a01/$F $O/v64_a02/$F
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $S48/b128_a01/$F $O/v128_a01_after512/$F
} > $R/after.txt
cat $R/after.txt
