#!/usr/bin/env bash
# session 31: the B=64 packaged scorer sampled at T=0.005 (chosen on the validation traces of sweep.sh) on the 48
# benchmark traces, the 16 unused held-out problems and the 60 AIME traces, each paired per trace with the T=0.003
# runs committed before (same tokens and full-cache CE, checked by compare.py), gap = tova -> golden of the same
# traces. About 25 min on 2 cores with the traces regenerated (the recipe's trace commands, seed 0). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; S=${S:-benchmarks/results/quality_B64_prekey_dagger/scorer}
R=benchmarks/results/temperature_s31; P=benchmarks/results/quality_B64_prekey_dagger
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
ev() {  # out traces: learned-only fidelity, sampled at T=0.005
  local out=$1 tr=$2
  [ -f $out/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m --traces $tr \
    --policies learned --scorer $S --budget 64 --interval 16 --batch-size 4 --out $out --quiet \
    --policy-arg selection=sample --policy-arg temperature=0.005
}
stamp benchmark
ev $E/t005_held $E/heldout_traces
[ -f $E/topk_held/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m \
    --traces $E/heldout_traces --policies learned --scorer $S --budget 64 --interval 16 --batch-size 4 \
    --out $E/topk_held --quiet      # top-k again, for the card (session 25's run predates the recorded scorer hash)
stamp "extra16 traces"
[ -f $E/split/heldout_extra16.jsonl ] || tail -16 $E/split/heldout.jsonl > $E/split/heldout_extra16.jsonl
x16() { RANK=$1 WORLD_SIZE=2 $PY -m foresight trace --model smollm2-135m --data $E/split/heldout_extra16.jsonl \
    --max-new-tokens 512 --batch-size 16 --seed 0 --out $E/heldout_extra16_traces --no-progress; }
x16 0 & p0=$!; x16 1 & p1=$!; wait $p0 && wait $p1
ev $E/t005_x16 $E/heldout_extra16_traces
stamp "aime traces"
bash benchmarks/quality/aime_traces.sh $E/aime
ev $E/t005_aime $E/aime/traces
C="$PY benchmarks/quality/compare.py"; F=fidelity.json:learned; A=benchmarks/results/quality_aime_packaged
{ $C $E/t005_held/$F $P/ev_held_r3_sample/$F --budget 64 --interval 16 --gap benchmarks/results/quality_B64_recipe336/quality.json:tova
  $C $E/t005_x16/$F $P/extra16/r3_sample/$F --budget 64 --interval 16 --gap benchmarks/results/quality_B64_recipe336/extra16/quality.json:tova
  $C $E/t005_aime/$F $A/ev64_sample/$F --budget 64 --interval 16 --gap benchmarks/results/quality_B64_aime/quality.json:tova
} | tee $R/confirm_compare.txt
for d in t005_held t005_x16 t005_aime topk_held; do
  mkdir -p $R/B64_$d && cp $E/$d/{fidelity.json,fidelity.md,settings.json} $R/B64_$d/
done
$PY benchmarks/quality/card.py --budget 64 --interval 16 --topk $R/B64_topk_held/$F --sample $R/B64_t005_held/$F \
    --reference benchmarks/results/quality_B64_recipe336/quality.json --out $R/card_fidelity.json
stamp done
