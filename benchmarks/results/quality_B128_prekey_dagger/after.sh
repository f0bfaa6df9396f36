#!/usr/bin/env bash
# sessions 26-28 (session 27 measured round 1: compare.txt; session 28 round 3 with ROUNDS_TOO=1: compare_r3.txt,
# 16 min; round 3 is the packaged smollm2-135m-b128-w32 since then): the B=64 recipe that ships (pre-RoPE keys,
# three DAgger rounds) at B=128/W=32. First the recipe's stages up to SL (resumable: kill it and rerun; every stage
# skips what exists):
#   B=128 W=32 HELDOUT=48 bash benchmarks/quality/recipe.sh
# Then this script, which needs only the trained scorers: every heuristic and golden on these traces are in the
# packaged scorer's run (../quality_B128_recipe336/quality.json: traces regenerated on a new machine reproduce it to
# four decimals, and compare.py refuses other tokens or CE), so the recipe's own benchmark stage is not needed.
# Learned-only fidelity of the final scorer (top-k and sampled at T=0.003) on the 47 benchmark traces and on the 16
# unused held-out problems, each paired per trace against the packaged B=128 scorer (quality.json:dagger,
# sampled/quality.json:dagger_sample, extra16/quality.json:recipe / recipe_sample), gap = tova -> golden of that run.
# ROUNDS_TOO=1 adds rounds 0-2 (top-k), each paired with the round before it, and the final scorer with round 2.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; B=128; W=32
SL=$E/sl_B${B}_W${W}_prekey-value-attn-age
P=benchmarks/results/quality_B128_recipe336; X=$E/heldout_extra16_traces
F=${F:-$SL/scorer}   # the scorer measured: the final one, or F=$SL/rounds/round-R/scorer for a finished round
# (session 29 extended the run to round 4, measured with F=$SL/rounds/round-4/scorer: compare_r4.txt; the packaged
# scorer is round 3, whose runs are the unsuffixed ev128_* directories)
[ -f $F/config.json ] || { echo "$F: run the recipe's SL stage first (see the header)" >&2; exit 2; }
x=""; case $F in */rounds/round-*/scorer) x=${F%/scorer}; x=_r${x##*round-};; esac   # a round's runs: _rR
ev() {  # ev OUT TRACES SCORER [extra args]: learned-only fidelity at B/W
  local out=$1 traces=$2 scorer=$3; shift 3
  [ -f $out/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m --traces $traces \
    --policies learned --scorer $scorer --budget $B --interval $W --batch-size 4 --out $out --quiet "$@"
}
S="--policy-arg selection=sample --policy-arg temperature=0.003"
ev $E/ev128_prekey$x $E/heldout_traces $F
ev $E/ev128_prekey${x}_sample $E/heldout_traces $F $S
[ -d $X ] || { tail -16 $E/split/heldout.jsonl > $E/split/heldout_extra16.jsonl; OMP_NUM_THREADS=2 $PY -m foresight \
    trace --model smollm2-135m --data $E/split/heldout_extra16.jsonl --max-new-tokens 512 --batch-size 16 --seed 0 --out $X; }
ev $E/ev128_x16_prekey$x $X $F
ev $E/ev128_x16_prekey${x}_sample $X $F $S
C="$PY benchmarks/quality/compare.py"; L=fidelity.json:learned
G="--budget $B --interval $W --gap $P/quality.json:tova"
$C $E/ev128_prekey$x/$L $P/quality.json:dagger $G                             # top-k vs packaged
$C $E/ev128_prekey${x}_sample/$L $P/sampled/quality.json:dagger_sample $G       # sampled vs packaged
G="--budget $B --interval $W --gap $P/extra16/quality.json:tova"
$C $E/ev128_x16_prekey$x/$L $P/extra16/quality.json:recipe $G
$C $E/ev128_x16_prekey${x}_sample/$L $P/extra16/quality.json:recipe_sample $G
[ -n "${ROUNDS_TOO:-}" ] || exit 0
G="--budget $B --interval $W --gap $P/quality.json:tova"
ev $E/ev128_prekey_r0 $E/heldout_traces $SL/rounds/round-0/scorer
prev=$E/ev128_prekey_r0
for r in 1 2; do ev $E/ev128_prekey_r$r $E/heldout_traces $SL/rounds/round-$r/scorer
  $C $E/ev128_prekey_r$r/$L $prev/$L $G; prev=$E/ev128_prekey_r$r; done
[ -n "$x" ] || $C $E/ev128_prekey/$L $prev/$L $G   # the final scorer (a round's F is already in the curve)
