#!/usr/bin/env bash
# session 51: the fine-tuned B=128 scorer (finetune128.sh's round 1, at its recorded defaults: top-k, spread 0.005,
# age prior 0.01, window 16) beyond the split, as a candidate for the packaged B=128 scorer. Runs only once
# finetune128.sh's rule has passed (or, with S=runs/s51/ft128/rounds/round-2/scorer, finetune128_r2.sh's). Rule,
# written (with finetune128.sh) before any number of either was read. The candidate replaces smollm2-135m-b128-w32
# only if all hold:
#   1. on the benchmark split (47 held-out traces at B=128) it closes at least 60% of the tova -> golden gap
#      pooled, and its paired interval against tova lies below zero (the issue's target);
#   2. pooled over the three 512-cap sets beyond the split (16 unused problems, 48 more traces of them, 60 AIME;
#      123 traces, pooled_gap.py) it closes at least the packaged scorer's 59.9%;
#   3. on the 60 AIME traces at the 1,024 cap it closes at least the packaged scorer's 59.3% pooled;
#   4. on none of the six sets (those five and the 48 512-cap validation traces) is its paired interval against the
#      packaged B=128 scorer (benchmarks/results/s50/) entirely above zero.
# About 35 min on 2 cores alone; every evaluation resumes. TAG (default s51) names the folder under
# benchmarks/results that receives the committed copies and check.txt (session 52's decay128.sh runs it with TAG=s52).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s51}; R=benchmarks/results
X=$E/heldout_extra16_traces T=${TAG:-s51}
S=${S:-$O/ft128/rounds/round-1/scorer}   # finetune128_r2.sh: S=...round-2/scorer
for f in $E/heldout_traces $E/aime/traces $E/extra16x3_traces $X $E/val_traces $E/aime1024/traces $S; do
  [ -e $f/plan.json ] || [ -e $f/config.json ] || { echo "s51/check128.sh: error: $f missing (run finetune128.sh first)" >&2; exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh $S $1 $O/$2 128 32; }
stamp evaluations
ev $E/heldout_traces held & p1=$!; ev $E/aime1024/traces aime1024 & p2=$!; wait $p1; wait $p2
ev $E/aime/traces aime & p1=$!; ev $E/extra16x3_traces x16x3 & p2=$!; wait $p1; wait $p2
ev $X x16 & p1=$!; ev $E/val_traces val & p2=$!; wait $p1; wait $p2
for s in held x16 x16x3 aime val aime1024; do   # the committed copies the comparisons read
  mkdir -p $R/$T/$s && cp $O/$s/{fidelity.json,fidelity.md,settings.json} $R/$T/$s/
done
F=fidelity.json:learned P=$R/s50
GH=$R/quality_B128_recipe336/quality.json:tova GX=$R/quality_B128_recipe336/extra16/quality.json:tova
G3=$R/extra16x3_s31/B128/quality.json:tova GA=$R/quality_aime_packaged/quality.json:tova
GV=$R/temperature_s31/B128/quality.json:tova Q=$R/long_s47/aime1024_b128.json
C() { $PY benchmarks/quality/compare.py "$@" --budget 128 --interval 32; }
{ echo "# 1. benchmark split: candidate - tova"
  C $R/$T/held/$F $GH --gap $GH
  echo "# 4. candidate - the packaged B=128 scorer (session 50), set by set"
  C $R/$T/held/$F $P/held/$F --gap $GH
  C $R/$T/x16/$F $P/x16/$F --gap $GX
  C $R/$T/x16x3/$F $P/x16x3/$F --gap $G3 --by-problem
  C $R/$T/aime/$F $P/aime/$F --gap $GA
  C $R/$T/val/$F $P/val/$F --gap $GV --by-problem
  echo "# 3. (and 4.) 1,024-cap AIME: candidate - the packaged B=128 scorer"
  C $R/$T/aime1024/$F $P/aime1024/$F --gap $Q:tova
  echo "# 2. pooled beyond the split: candidate, then the packaged scorer"
  for s in "$R/$T/x16 $R/$T/x16x3 $R/$T/aime" "$P/x16 $P/x16x3 $P/aime"; do set -- $s
    $PY benchmarks/quality/pooled_gap.py --budget 128 --interval 32 --set $1/$F $GX --set $2/$F $G3 --set $3/$F $GA
  done
  echo "# by trace length, 1,024-cap AIME (share of the tova -> golden gap closed)"
  $PY benchmarks/quality/by_length.py --traces $E/aime1024/traces --gap $Q:tova --budget 128 --interval 32 \
      $P/aime1024/$F $R/$T/aime1024/$F
} > $R/$T/check.txt
cat $R/$T/check.txt
stamp done
