#!/usr/bin/env bash
# The quality recipe's SL + DAgger stage in one place, for recipe.sh:
# `foresight train sl` on two CPU ranks with the packaged scorers' settings (2,400 steps, pre-RoPE features, three
# DAgger rounds at beta 0.5), resumed (--resume) when OUT already holds a started run.
#
#   bash benchmarks/quality/train_sl.sh B W OUT [KEY=VALUE ...]    # later keys win, e.g. seed=1 dagger_rounds=4
#
# Environment: E (traces, labels and feature cache; default runs/quality), PY (default .venv/bin/python), PORT
# (the rendezvous port, default 29811).
set -euo pipefail
[ $# -ge 3 ] || { echo "train_sl.sh: error: usage: train_sl.sh B W OUT [KEY=VALUE ...]" >&2; exit 2; }
B=$1 W=$2 SL=$3; shift 3
E=${E:-runs/quality} PY=${PY:-.venv/bin/python}
resume=""; { [ -f $SL/rounds/dagger.json ] || [ -d $SL/checkpoints ]; } && resume="--resume"
DS_ACCELERATOR=cpu $PY -m foresight launch --nproc-per-node 2 --master-port ${PORT:-29811} \
    train sl --config configs/sl.yaml traces=$E/train_traces labels=$E/golden_train_B${B}_W${W} \
    budget=$B interval=$W heldout=8 steps=2400 eval_fidelity=false replay_batch_size=4 \
    "feature_set=[prekey,value,attn,age]" pair_weight=gap dagger_rounds=3 dagger_beta=0.5 \
    feature_cache=$E/features out_dir=$SL "$@" $resume
