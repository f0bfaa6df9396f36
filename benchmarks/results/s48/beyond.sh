#!/usr/bin/env bash
# session 48, second step: the age prior beyond the validation split, on the 60 AIME traces at the 1,024-token cap
# (runs/quality/aime1024, session 47; no choice was ever made on them). Written before run.sh's numbers were read.
# Both lam of run.sh at both budgets: the packaged B=64 scorer with top-k + age_prior, the packaged B=128 scorer at
# its default top-k + age_prior, paired by trace against session 47's measurements of the same scorers (B=64: its
# default, sampled T=0.005, and plain top-k; B=128: its default).
# Rule for a later default (nothing is repackaged in this session): a lam becomes the candidate default at a budget
# only if it is lower than that budget's packaged default both on the 1,024-cap validation traces (run.sh) and here,
# each paired interval below zero here. About 30 min on 2 cores; every evaluation resumes.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s48}; R=benchmarks/results/s48
A=$E/aime1024/traces Q64=runs/s47/aime1024_b64/quality.json Q128=runs/s47/aime1024_b128/quality.json
for f in $A/plan.json $Q64 $Q128; do
  [ -f $f ] || { echo "s48/beyond.sh: error: $f missing (run long_s47/run.sh first)" >&2; exit 2; }
done
mkdir -p $O
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
S64=smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
ev $S64 $A $O/aime_b64_topk_a003 64 16 --policy-arg selection=topk --policy-arg age_prior=0.003 & p1=$!
ev $S64 $A $O/aime_b64_topk_a01 64 16 --policy-arg selection=topk --policy-arg age_prior=0.01 & p2=$!
wait $p1; wait $p2
ev $S128 $A $O/aime_b128_a003 128 32 --policy-arg age_prior=0.003 & p1=$!
ev $S128 $A $O/aime_b128_a01 128 32 --policy-arg age_prior=0.01 & p2=$!
wait $p1; wait $p2
F=fidelity.json:learned
C() { $PY benchmarks/quality/compare.py "$@"; }
{ for a in a003 a01; do
    echo "# B=64, 1,024-cap AIME: top-k with age_prior $a - the packaged default (sampled T=0.005)"
    C $O/aime_b64_topk_$a/$F $Q64:def --budget 64 --interval 16 --gap $Q64:tova
    echo "# B=64, 1,024-cap AIME: top-k with age_prior $a - plain top-k (spread 0.005)"
    C $O/aime_b64_topk_$a/$F $Q64:topk --budget 64 --interval 16 --gap $Q64:tova
    echo "# B=128, 1,024-cap AIME: default top-k with age_prior $a - without"
    C $O/aime_b128_$a/$F $Q128:def --budget 128 --interval 32 --gap $Q128:tova
  done
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $A --gap $Q64:tova --budget 64 --interval 16 $Q64:def $Q64:topk \
      $O/aime_b64_topk_a003/$F $O/aime_b64_topk_a01/$F
  $PY benchmarks/quality/by_length.py --traces $A --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $O/aime_b128_a003/$F $O/aime_b128_a01/$F
} > $R/beyond.txt
cat $R/beyond.txt
