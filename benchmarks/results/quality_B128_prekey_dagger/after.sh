#!/usr/bin/env bash
# sessions 26-: the B=64 recipe that ships (pre-RoPE keys, three DAgger rounds) at B=128/W=32. First the recipe itself,
# resumable (kill it and rerun; every stage skips what exists):
#   B=128 W=32 HELDOUT=48 ROUNDS=3 FEATURES=prekey,value,attn,age bash benchmarks/quality/recipe.sh
# Then this script: the final scorer sampled (T=0.003) on the 47 benchmark traces, each of rounds 1-2 top-k, and the
# final scorer on the 16 unused held-out problems (top-k and sampled), every one paired per trace against the packaged
# B=128 scorer (../quality_B128_recipe336: quality.json:dagger, sampled/quality.json:dagger_sample,
# extra16/quality.json:recipe / recipe_sample), gap = tova -> golden of that run. About 45 min on 2 cores.
# Status (session 26): the recipe is running (resumable); this script has not run yet.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; B=128; W=32
SL=$E/sl_B${B}_W${W}_prekey-value-attn-age; Q=$E/quality_B${B}_W${W}_prekey-value-attn-age
P=benchmarks/results/quality_B128_recipe336; X=$E/heldout_extra16_traces
[ -f $SL/scorer/config.json ] && [ -f $Q/quality.json ] || { echo "run the recipe first (see the header)" >&2; exit 2; }
ev() {  # ev OUT TRACES SCORER [extra args]: learned-only fidelity at B/W
  local out=$1 traces=$2 scorer=$3; shift 3
  [ -f $out/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m --traces $traces \
    --policies learned --scorer $scorer --budget $B --interval $W --batch-size 4 --out $out --quiet "$@"
}
S="--policy-arg selection=sample --policy-arg temperature=0.003"
ev $E/ev128_prekey_sample $E/heldout_traces $SL/scorer $S
for r in 1 2; do ev $E/ev128_prekey_r$r $E/heldout_traces $SL/rounds/round-$r/scorer; done
[ -d $X ] || { tail -16 $E/split/heldout.jsonl > $E/split/heldout_extra16.jsonl; OMP_NUM_THREADS=2 $PY -m foresight \
    trace --model smollm2-135m --data $E/split/heldout_extra16.jsonl --max-new-tokens 512 --batch-size 16 --seed 0 --out $X; }
ev $E/ev128_x16_prekey $X $SL/scorer
ev $E/ev128_x16_prekey_sample $X $SL/scorer $S
G="--budget $B --interval $W --gap $P/quality.json:tova"
$PY benchmarks/quality/compare.py $Q/quality.json:dagger $P/quality.json:dagger $G          # top-k vs packaged
$PY benchmarks/quality/compare.py $E/ev128_prekey_sample/fidelity.json:learned $P/sampled/quality.json:dagger_sample $G
$PY benchmarks/quality/compare.py $Q/quality.json:dagger $Q/quality.json:sl $G              # three rounds vs SL
for r in 1 2; do $PY benchmarks/quality/compare.py $E/ev128_prekey_r$r/fidelity.json:learned $Q/quality.json:sl $G; done
G="--budget $B --interval $W --gap $P/extra16/quality.json:tova"
$PY benchmarks/quality/compare.py $E/ev128_x16_prekey/fidelity.json:learned $P/extra16/quality.json:recipe $G
$PY benchmarks/quality/compare.py $E/ev128_x16_prekey_sample/fidelity.json:learned $P/extra16/quality.json:recipe_sample $G
