#!/usr/bin/env bash
# session 48: an age prior on top-k, the deterministic counterpart of what a sampled draw does on long traces.
# Session 47: top-k keeps about twice golden's share of entries older than 400 tokens late in long traces.
# neutral.py (this directory): holding the cumulative sum at its mean barely changes that (it is not H2O's
# heavy-hitter sum), holding the age at its mean makes it far worse (the scorer's own age term is what evicts old
# entries, and on long traces it is too weak). A draw evicts a near-boundary entry with some probability at every
# event, so its survival decays with the events it lived through; top-k's does not. The learned policy's
# `age_prior=lam` (new) subtracts lam * log1p(age) from every score. An 8-trace probe (4 longest, 4 middle
# validation traces, packaged B=64, top-k) gave pooled 1.2431 (lam 0), 1.2224 (0.003), 1.2181 (0.01), sampled 1.2291.
# This run (measurement on the validation traces, the split the knob would be chosen on; no default changes here):
# the packaged scorers with top-k at lam 0 / 0.003 / 0.01 on the 48 1,024-cap validation traces at B=64/W=16 and
# lam 0.003 / 0.01 at B=128/W=32 (lam 0 there is session 47's `def`), paired by problem against plain top-k and
# against the packaged default. Choosing lam and checking it beyond the split is the next step, with its rule
# committed before those numbers. About 40 min on 2 cores. Every evaluation resumes (skipped when done).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s48}; R=benchmarks/results/s48
V=$E/val1024_traces Q64=runs/s46/val1024/quality.json Q128=runs/s47/val1024_b128/quality.json
for f in $V/plan.json $Q64 $Q128; do
  [ -f $f ] || { echo "s48/run.sh: error: $f missing (run long_s46/run.sh and long_s47/run.sh first)" >&2; exit 2; }
done
mkdir -p $O
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
S64=smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
ev $S64 $V $O/b64_topk 64 16 --policy-arg selection=topk --policy-arg age_prior=0 & p1=$!
ev $S64 $V $O/b64_topk_a003 64 16 --policy-arg selection=topk --policy-arg age_prior=0.003 & p2=$!; wait $p1; wait $p2
ev $S64 $V $O/b64_topk_a01 64 16 --policy-arg selection=topk --policy-arg age_prior=0.01 & p1=$!
ev $S128 $V $O/b128_a003 128 32 --policy-arg age_prior=0.003 & p2=$!; wait $p1; wait $p2
ev $S128 $V $O/b128_a01 128 32 --policy-arg age_prior=0.01
F=fidelity.json:learned
C() { $PY benchmarks/quality/compare.py "$@" --by-problem; }
{ for a in a003 a01; do
    echo "# B=64, 1,024-cap validation: top-k with age_prior $a - plain top-k"
    C $O/b64_topk_$a/$F $O/b64_topk/$F --budget 64 --interval 16 --gap $Q64:tova
    echo "# B=64, 1,024-cap validation: top-k with age_prior $a - the packaged default (sampled T=0.005)"
    C $O/b64_topk_$a/$F $Q64:avg3 --budget 64 --interval 16 --gap $Q64:tova
    echo "# B=128, 1,024-cap validation: default top-k with age_prior $a - without"
    C $O/b128_$a/$F $Q128:def --budget 128 --interval 32 --gap $Q128:tova
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q64:tova --budget 64 --interval 16 $Q64:avg3 \
      $O/b64_topk/$F $O/b64_topk_a003/$F $O/b64_topk_a01/$F
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $O/b128_a003/$F $O/b128_a01/$F
} > $R/compare.txt
cat $R/compare.txt
