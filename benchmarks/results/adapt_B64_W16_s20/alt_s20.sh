#!/usr/bin/env bash
# session 20 (issue 13, DESIGN 4b "alternated with the adapter"): retrain the scorer for session 18's adapted model
# (golden labels of the base model's training traces replayed by the adapted model, then the quality recipe's
# SL + 2 DAgger rounds with adapter=...); the measurement is the README's adapt_eval.py --adapted-scorer. Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}; PY=${PY:-.venv/bin/python}; A=$E/adapt_s18_B64/adapter
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$HOME/.cache/torch_extensions OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "golden labels (adapted model)"
two_ranks $PY -m foresight golden --adapter $A --allow-other-model --traces $E/train_traces \
    --out $E/golden_train_B64_W16_a18 --budget 64 --interval 16 --no-progress
stamp "SL + 2 DAgger rounds (adapted model)"
SL=$E/sl_a18_B64_W16
resume=""; { [ -f $SL/rounds/dagger.json ] || [ -d $SL/checkpoints ]; } && resume="--resume"
$PY -m torch.distributed.run --nproc_per_node 2 --master_port 29811 \
    -m foresight train sl --config configs/sl.yaml adapter=$A traces=$E/train_traces labels=$E/golden_train_B64_W16_a18 \
    budget=64 interval=16 heldout=8 steps=2400 eval_fidelity=false replay_batch_size=4 \
    feature_set=[key,value,attn,age] pair_weight=gap dagger_rounds=2 dagger_beta=0.5 \
    feature_cache=$E/features_a18 out_dir=$SL $resume
stamp done
