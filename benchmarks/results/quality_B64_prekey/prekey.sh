#!/usr/bin/env bash
# sessions 22-23: SL round 0 of the recipe (B=64/W=16, 328 training traces, 2,400 steps, seed 0) trained twice, with
# pre-RoPE keys (feature_set [prekey,value,attn,age]) and with post-RoPE keys ([key,value,attn,age], the recipe's),
# same traces, labels, features and seed; then top-k fidelity of both on the 48 benchmark traces and on the 60 AIME
# traces, paired. Needs the recipe's traces and labels (`HELDOUT=48 bash benchmarks/quality/recipe.sh` up to its SL
# stage) and the AIME traces and labels (benchmarks/results/quality_B64_aime/aime.sh). Every stage skips what exists.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; R=benchmarks/results/quality_B64_recipe336
A=benchmarks/results/quality_B64_aime/quality.json
sl() {  # SL round 0 with feature group $1 as the key feature
  local out=$E/sl0_$1 resume=""; [ -d $E/sl0_$1/checkpoints ] && resume="--resume"
  [ -f $out/scorer/config.json ] || OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu $PY -m torch.distributed.run \
    --nproc_per_node 2 --master_port 29812 -m foresight train sl --config configs/sl.yaml traces=$E/train_traces \
    labels=$E/golden_train_B64_W16 budget=64 interval=16 heldout=8 steps=2400 eval_fidelity=false \
    replay_batch_size=4 feature_set=[$1,value,attn,age] pair_weight=gap feature_cache=$E/features out_dir=$out $resume
}
ev() {  # top-k fidelity of sl0_$2 on set $1 (held: the 48 benchmark traces, aime: the 60 AIME traces)
  local tr=$E/aime/traces; [ $1 = held ] && tr=$E/heldout_traces
  [ -f $E/ev_$1_$2/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m \
    --traces $tr --policies learned --scorer $E/sl0_$2/scorer --budget 64 --interval 16 --batch-size 4 \
    --out $E/ev_$1_$2 --quiet
}
sl prekey; sl key
for s in held aime; do ev $s prekey; ev $s key; done
$PY benchmarks/quality/compare.py $E/ev_held_prekey/fidelity.json:learned $E/ev_held_key/fidelity.json:learned \
    --budget 64 --interval 16 --gap $R/quality.json:tova
$PY benchmarks/quality/compare.py $E/ev_aime_prekey/fidelity.json:learned $E/ev_aime_key/fidelity.json:learned \
    --budget 64 --interval 16 --gap $A:tova
$PY benchmarks/quality/compare.py $E/ev_held_key/fidelity.json:learned $R/quality.json:sl --budget 64 --interval 16 \
    --gap $R/quality.json:tova   # the retrained post-RoPE round 0 against the committed one: the rerun noise
$PY benchmarks/quality/by_length.py --traces $E/aime/traces --budget 64 --interval 16 --gap $A:tova \
    $E/ev_aime_key/fidelity.json:learned $E/ev_aime_prekey/fidelity.json:learned $A:packaged
