#!/usr/bin/env bash
# session 47: the packaged scorers on traces as long as `foresight trace` writes them by default (1,024 new tokens).
# Session 46 found, on the 48 validation traces regenerated at a 1,024-token cap, that top-k breaks on the traces
# longer than anything it trained on (round 3 top-k: -44% of the tova -> golden gap on the 14 traces of 1,024+
# tokens; sampled 53%, the packaged B=64 avg3 sampled 74%). The packaged B=128 scorer still selects top-k by default
# (spread 0.005 + newcomer bonus 0.012; session 42: at the 512 cap sampling and top-k were level there), and every
# set beyond the split was cut at 512 new tokens. So:
# 1. validation at B=128/W=32: golden labels of the 1,024-cap validation traces (runs/quality/val1024_traces, session
#    46) and the quality benchmark: tova, golden, the packaged B=128 scorer at its default (top-k) and sampled at its
#    recorded temperature 0.003.
# 2. beyond the split: the 60 AIME 2024 + 2025 problems at a 1,024-token cap (seed 0, as the 512-cap AIME set),
#    golden labels at both budgets, and the benchmark at each: tova, golden, each packaged scorer at both selections
#    (B=64: its default sampled at 0.005 and top-k at its recorded spread; B=128 as in 1). Reported, no tuning.
# Decision rule, fixed before any number: the packaged B=128 scorer records `selection: sample` (as the B=64 one does
# since session 42) only if sampled at T=0.003 is lower than its default top-k on the 1,024-cap validation traces
# with the paired (by problem) interval below zero, and on the 1,024-cap AIME traces the paired point is not above
# zero. Otherwise it keeps top-k. No other choice rides on these numbers. Step 1 ~40 min on 2 cores, step 2 ~3 h.
# Every stage resumes when rerun (run.py journals each trace).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s47}; R=benchmarks/results/long_s47
V=$E/val1024_traces LV=$E/golden_val1024_B128_W32 A=$E/aime1024
B64=smollm2-135m-b64-w16 B128=benchmarks/results/s50/b128_s41
export OMP_NUM_THREADS=1
for f in $V/plan.json; do
  [ -f $f ] || { echo "long_s47/run.sh: error: $f missing (run benchmarks/results/long_s46/run.sh's first stage)" >&2; exit 2; }
done
mkdir -p $O $R
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
Q() {  # Q OUT TRACES SETTING POLICY-SCORER-ARGS...: the quality benchmark, skipped when done
  local out=$1 traces=$2 setting=$3; shift 3
  [ -f $out/quality.json ] || OMP_NUM_THREADS=2 $PY benchmarks/quality/run.py --model smollm2-135m --traces $traces \
      --setting $setting --policies tova --batch-size 4 --out $out "$@"
}
b128() { echo --scorer def=$B128 --scorer t003=$B128 --policy-arg t003.selection=sample; }
C() { $PY benchmarks/quality/compare.py "$@" --by-problem; }

stamp "1. validation at B=128/W=32"
two_ranks $PY -m foresight golden --traces $V --out $LV --budget 128 --interval 32 --no-progress
Q $O/val1024_b128 $V 128:32=$LV $(b128)
{ echo "# 1,024-cap validation, B=128: packaged sampled at T=0.003 - packaged at its default top-k (the rule)"
  C $O/val1024_b128/quality.json:t003 $O/val1024_b128/quality.json:def --budget 128 --interval 32 \
    --gap $O/val1024_b128/quality.json:tova
} | tee $R/compare.txt
cp $O/val1024_b128/quality.md $R/val1024_b128.md

stamp "2. AIME at a 1,024-token cap"
MAX_NEW=1024 PY=$PY bash benchmarks/quality/aime_traces.sh $A
two_ranks $PY -m foresight golden --traces $A/traces --out $A/golden_B64_W16 --budget 64 --interval 16 --no-progress
two_ranks $PY -m foresight golden --traces $A/traces --out $A/golden_B128_W32 --budget 128 --interval 32 --no-progress
Q $O/aime1024_b128 $A/traces 128:32=$A/golden_B128_W32 $(b128)
Q $O/aime1024_b64 $A/traces 64:16=$A/golden_B64_W16 --scorer def=$B64 --scorer topk=$B64 \
    --policy-arg def.selection=sample --policy-arg topk.selection=topk --policy-arg topk.age_prior=0
{ echo "# 1,024-cap AIME, B=128: packaged sampled at T=0.003 - packaged at its default top-k (the rule: point not above zero)"
  C $O/aime1024_b128/quality.json:t003 $O/aime1024_b128/quality.json:def --budget 128 --interval 32 \
    --gap $O/aime1024_b128/quality.json:tova
  echo "# 1,024-cap AIME, B=64: packaged at its default (sampled T=0.005) - top-k at its recorded spread"
  C $O/aime1024_b64/quality.json:def $O/aime1024_b64/quality.json:topk --budget 64 --interval 16 \
    --gap $O/aime1024_b64/quality.json:tova
} | tee -a $R/compare.txt
cp $O/aime1024_b128/quality.md $R/aime1024_b128.md; cp $O/aime1024_b64/quality.md $R/aime1024_b64.md
stamp done
