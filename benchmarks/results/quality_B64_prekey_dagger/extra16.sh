#!/usr/bin/env bash
# session 25: the pre-RoPE rounds on the 16 held-out problems that no benchmark had used (the recipe's extra16 check,
# ../quality_B64_recipe336/extra16/): trace them as the recipe did (seed 0; the comparison refuses other tokens),
# then top-k fidelity of rounds 0, 2 and 3 and round 3 sampled, each compared with the packaged recipe scorer
# (quality.json:recipe / recipe_sample there), gap = tova -> golden of that run. About 20 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; SL=$E/sl_B64_W16_prekey_r4; X=$E/heldout_extra16_traces
R=benchmarks/results/quality_B64_recipe336/extra16/quality.json
G="--budget 64 --interval 16 --gap $R:tova"
[ -f $E/split/heldout_extra16.jsonl ] || tail -16 $E/split/heldout.jsonl > $E/split/heldout_extra16.jsonl
[ -d $X ] || OMP_NUM_THREADS=2 $PY -m foresight trace --model smollm2-135m --data $E/split/heldout_extra16.jsonl \
    --max-new-tokens 512 --batch-size 16 --seed 0 --out $X
ev() {  # round $1's scorer on the 16 traces into $E/ev_x16_prekey_r$1$2, extra args after
  local r=$1 tag=$2; shift 2
  [ -f $E/ev_x16_prekey_r$r$tag/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity \
    --model smollm2-135m --traces $X --policies learned --scorer $SL/rounds/round-$r/scorer \
    --budget 64 --interval 16 --batch-size 4 --out $E/ev_x16_prekey_r$r$tag --quiet "$@"
}
for r in 0 2 3; do ev $r ""; done
ev 3 _sample --policy-arg selection=sample --policy-arg temperature=0.003
for r in 0 2 3; do $PY benchmarks/quality/compare.py $E/ev_x16_prekey_r$r/fidelity.json:learned $R:recipe $G; done
$PY benchmarks/quality/compare.py $E/ev_x16_prekey_r3_sample/fidelity.json:learned $R:recipe_sample $G
# committed copies: extra16/r<N>[_sample]/ (fidelity.json, .md, settings.json), the comparisons in extra16/compare.txt
