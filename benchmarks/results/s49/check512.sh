#!/usr/bin/env bash
# session 49: the session-48 candidate (the packaged B=64 scorer, top-k at its recorded spread 0.005, plus
# age_prior 0.01) on the 512-token-cap sets, before it may become the B=64 default. Session 48 found it ahead of the
# packaged default (sampled T=0.005) on both 1,024-cap sets (validation 64.0% vs 56.9%, AIME 61.2% vs 56.3%), and on
# short validation traces slightly behind (under 300 tokens 74% vs 79%), so the question here is whether the
# shorter traces every earlier number rests on pay for the long-trace gain.
# Rule, written before any number of this script was read. The candidate becomes the B=64 scorer's recorded default
# (selection topk, age_prior 0.01) only if all three hold:
#   1. on the benchmark split (48 held-out traces) it closes at least 60% of the tova -> golden gap pooled, and its
#      paired interval against tova lies below zero (the issue's target);
#   2. pooled over the three sets beyond the split (16 unused problems, 48 more traces of them, 60 AIME; 124 traces,
#      pooled_gap.py) it closes at least the default's 57.8%;
#   3. on none of the five 512-cap sets (those four and the 48 validation traces) is its paired interval against the
#      default entirely above zero.
# Rebuilds the traces first (about 25 min on 2 cores); every evaluation resumes (skipped when done).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s49}; R=benchmarks/results
[ -f $E/split/heldout.jsonl ] || { echo "s49/check512.sh: error: $E/split missing (python benchmarks/quality/split.py $E/split)" >&2; exit 2; }
[ -f $E/val_traces/plan.json ] || { echo "s49/check512.sh: error: $E/val_traces missing (temperature_s31)" >&2; exit 2; }
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp traces
HELDOUT=48 STAGE=heldout bash benchmarks/quality/recipe.sh
STAGE=traces bash $R/extra16x3_s31/run.sh
bash benchmarks/quality/aime_traces.sh $E/aime
X=$E/heldout_extra16_traces
[ -d $X ] || { tail -16 $E/split/heldout.jsonl > $E/split/heldout_extra16.jsonl; OMP_NUM_THREADS=2 $PY -m foresight \
    trace --model smollm2-135m --data $E/split/heldout_extra16.jsonl --max-new-tokens 512 --batch-size 16 --seed 0 --out $X --no-progress; }
mkdir -p $O
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh smollm2-135m-b64-w16 $1 $O/$2 64 16 \
    --policy-arg selection=topk --policy-arg age_prior=0.01; }
stamp evaluations
ev $E/heldout_traces held & p1=$!; ev $E/aime/traces aime & p2=$!; wait $p1; wait $p2
ev $E/extra16x3_traces x16x3 & p1=$!; ev $X x16 & p2=$!; wait $p1; wait $p2
ev $E/val_traces val
for s in held x16 x16x3 aime val; do   # the committed copies the comparisons read
  mkdir -p $R/s49/$s && cp $O/$s/{fidelity.json,fidelity.md,settings.json} $R/s49/$s/
done
F=fidelity.json:learned S=$R/ensemble_s33
GH=$R/quality_B64_recipe336/quality.json:tova GX=$R/quality_B64_recipe336/extra16/quality.json:tova
G3=$R/extra16x3_s31/B64/quality.json:tova GA=$R/quality_B64_aime/quality.json:tova GV=$R/temperature_s31/B64/quality.json:tova
C() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
{ echo "# 1. benchmark split: candidate - tova"
  C $R/s49/held/$F $GH --gap $GH
  echo "# 3. candidate - the packaged default (sampled T=0.005), set by set"
  C $R/s49/held/$F $S/held_t005/$F --gap $GH
  C $R/s49/x16/$F $S/x16_t005/$F --gap $GX
  C $R/s49/x16x3/$F $S/x16x3_t005/$F --gap $G3 --by-problem
  C $R/s49/aime/$F $S/aime_t005/$F --gap $GA
  C $R/s49/val/$F $S/val_avg3_t005/$F --gap $GV --by-problem
  echo "# 2. pooled beyond the split: candidate, then the default"
  for s in "$R/s49/x16 $R/s49/x16x3 $R/s49/aime" "$S/x16_t005 $S/x16x3_t005 $S/aime_t005"; do set -- $s
    $PY benchmarks/quality/pooled_gap.py --budget 64 --interval 16 --set $1/$F $GX --set $2/$F $G3 --set $3/$F $GA
  done
} > $R/s49/check512.txt
cat $R/s49/check512.txt
stamp done
