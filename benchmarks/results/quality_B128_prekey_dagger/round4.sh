#!/usr/bin/env bash
# session 29: a fourth DAgger round for the B=128 pre-RoPE run (beta 0.5^4), then round 4 against round 3 (the packaged
# scorer) on the 47 benchmark traces, the 16 unused problems and the 60 AIME traces (../quality_aime_packaged/aime.sh
# first). Resumable: every stage skips what exists. Outputs: compare_r4.txt, ../quality_aime_packaged/compare_B128_r4.txt
set -uo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; B=128; W=32; SL=$E/sl_B${B}_W${W}_prekey-value-attn-age
DS_ACCELERATOR=cpu $PY -m torch.distributed.run --nproc_per_node 2 -m foresight train sl --config configs/sl.yaml \
    traces=$E/train_traces labels=$E/golden_train_B${B}_W${W} budget=$B interval=$W heldout=8 steps=2400 \
    eval_fidelity=false replay_batch_size=4 feature_set=[prekey,value,attn,age] pair_weight=gap dagger_rounds=4 \
    dagger_beta=0.5 feature_cache=$E/features out_dir=$SL --resume || exit 1
F=$SL/rounds/round-4/scorer
[ -f $F/config.json ] || { echo "no round-4 scorer" >&2; exit 2; }
echo "== $(date -u +%FT%TZ) after.sh"
F=$F bash benchmarks/results/quality_B128_prekey_dagger/after.sh
C="$PY benchmarks/quality/compare.py"; L=fidelity.json:learned; P=benchmarks/results/quality_B128_recipe336
echo "== $(date -u +%FT%TZ) round 4 vs round 3"
G="--budget $B --interval $W --gap $P/quality.json:tova"
$C $E/ev128_prekey_r4/$L $E/ev128_prekey/$L $G
$C $E/ev128_prekey_r4_sample/$L $E/ev128_prekey_sample/$L $G
G="--budget $B --interval $W --gap $P/extra16/quality.json:tova"
$C $E/ev128_x16_prekey_r4/$L $E/ev128_x16_prekey/$L $G
$C $E/ev128_x16_prekey_r4_sample/$L $E/ev128_x16_prekey_sample/$L $G
echo "== $(date -u +%FT%TZ) AIME"
A=$E/aime; S="--policy-arg selection=sample --policy-arg temperature=0.003"
for v in "" _sample; do
  out=$A/ev128_r4$v
  [ -f $out/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m --traces $A/traces \
    --policies learned --scorer $F --budget $B --interval $W --batch-size 4 --out $out --quiet $([ -n "$v" ] && echo $S)
done
G="--budget $B --interval $W --gap $A/quality_B128/quality.json:tova"
$C $A/ev128_r4/$L $A/quality_B128/quality.json:packaged $G
$C $A/ev128_r4_sample/$L $A/quality_B128/quality.json:packaged_sample $G
echo "== $(date -u +%FT%TZ) done"
