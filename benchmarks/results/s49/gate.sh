#!/usr/bin/env bash
# session 49, exploration on the 1,024-cap validation traces (the split a knob is chosen on; no default changes
# here). Session 48's age prior lam * log1p(age) moved B=128's long traces from 36% to 53% of the gap and cost as much
# on its short ones (level pooled); at B=64 it costs a few points under 300 tokens. A short trace's entries are all
# young, so a prior that counts only the age past a0 tokens (`age_prior_from=a0`, new: lam * log1p(max(age - a0, 0)))
# leaves them as trained and keeps the long traces' repair. slope.sh found a prior linear in age worse than the
# logarithmic one (it evicts the oldest entries, the prompt among them, on long traces). Here lam 0.01 from a0 = 256
# and 512 at B=128 (its default top-k) and from 256 at B=64 (its default since this session: top-k, spread 0.005,
# age_prior 0.01), paired by problem against each default and session 48's ungated prior. About 40 min on 2 cores.
# Every evaluation resumes (skipped when done).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s49}; R=benchmarks/results/s49
V=$E/val1024_traces Q64=runs/s46/val1024/quality.json Q128=runs/s47/val1024_b128/quality.json S48=runs/s48
for f in $V/plan.json $Q64 $Q128 $S48/b64_topk_a01/fidelity.json $S48/b128_a01/fidelity.json; do
  [ -f $f ] || { echo "s49/gate.sh: error: $f missing (run long_s46, long_s47 and s48/run.sh first)" >&2; exit 2; }
done
mkdir -p $O
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$@"; }
S64=smollm2-135m-b64-w16 S128=benchmarks/results/s50/b128_s41
ev $S128 $V $O/v128_a01_from256 128 32 --policy-arg age_prior=0.01 --policy-arg age_prior_from=256 & p1=$!
ev $S128 $V $O/v128_a01_from512 128 32 --policy-arg age_prior=0.01 --policy-arg age_prior_from=512 & p2=$!
wait $p1; wait $p2
ev $S64 $V $O/v64_a01_from256 64 16 --policy-arg selection=topk --policy-arg age_prior=0.01 --policy-arg age_prior_from=256
F=fidelity.json:learned
C() { $PY benchmarks/quality/compare.py "$@" --by-problem; }
{ for a in 256 512; do
    echo "# B=128, 1,024-cap validation: default top-k with age_prior 0.01 from $a - the default (no prior)"
    C $O/v128_a01_from$a/$F $Q128:def --budget 128 --interval 32 --gap $Q128:tova
    echo "# B=128: age_prior 0.01 from $a - age_prior 0.01 from 0 (session 48)"
    C $O/v128_a01_from$a/$F $S48/b128_a01/$F --budget 128 --interval 32 --gap $Q128:tova
  done
  echo "# B=64: top-k, age_prior 0.01 from 256 - from 0 (this session's default; session 48's run)"
  C $O/v64_a01_from256/$F $S48/b64_topk_a01/$F --budget 64 --interval 16 --gap $Q64:tova
  echo "# by trace length (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q64:tova --budget 64 --interval 16 $Q64:avg3 \
      $S48/b64_topk_a01/$F $O/v64_a01_from256/$F
  $PY benchmarks/quality/by_length.py --traces $V --gap $Q128:tova --budget 128 --interval 32 $Q128:def \
      $S48/b128_a01/$F $O/v128_a01_from256/$F $O/v128_a01_from512/$F
} > $R/gate.txt
cat $R/gate.txt
