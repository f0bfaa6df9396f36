#!/usr/bin/env bash
# session 22: SL round 0 of the recipe (B=64/W=16, 328 training traces, 2,400 steps, seed 0) with pre-RoPE keys
# (feature_set [prekey,value,attn,age]) in place of the post-RoPE ones, then top-k fidelity on the 48 benchmark
# traces, compared with the committed post-RoPE round 0 (`sl` of quality_B64_recipe336, same traces/labels/seed).
# Needs the recipe's traces and labels: `HELDOUT=48 bash benchmarks/quality/recipe.sh` up to its SL stage.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; R=benchmarks/results/quality_B64_recipe336
resume=""; [ -d $E/sl0_prekey/checkpoints ] && resume="--resume"
OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu $PY -m torch.distributed.run --nproc_per_node 2 --master_port 29812 \
    -m foresight train sl --config configs/sl.yaml traces=$E/train_traces labels=$E/golden_train_B64_W16 \
    budget=64 interval=16 heldout=8 steps=2400 eval_fidelity=false replay_batch_size=4 \
    feature_set=[prekey,value,attn,age] pair_weight=gap feature_cache=$E/features out_dir=$E/sl0_prekey $resume
OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m --traces $E/heldout_traces --policies learned \
    --scorer $E/sl0_prekey/scorer --budget 64 --interval 16 --batch-size 4 --out $E/ev_held_prekey --quiet
$PY benchmarks/quality/compare.py $E/ev_held_prekey/fidelity.json:learned $R/quality.json:sl --budget 64 --interval 16 \
    --gap $R/quality.json:tova
$PY benchmarks/quality/by_length.py --traces $E/heldout_traces --budget 64 --interval 16 --gap $R/quality.json:tova \
    $R/quality.json:sl $E/ev_held_prekey/fidelity.json:learned $R/quality.json:dagger
