#!/usr/bin/env bash
# The e2e stage's speed on two CPU cores, alone: one process on two threads (16 steps of one trace) against two
# single-threaded ranks (8 steps of two traces, the same 16 traces), alternating twice; prints each run's training
# seconds. Needs a recipe run's training traces and SL + DAgger scorer under $E (default runs/quality).
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=${E:-runs/quality}
O=runs/e2e_ranks
mkdir -p $O
common="--config configs/e2e.yaml traces=$R/train_traces max_traces=96 init_scorer=$R/sl_B64_W16_prekey-value-attn-age/scorer
    heldout=4 eval_traces=1 eval_before=false checkpoint_every=0 device=cpu"
for rep in 1 2; do
    rm -rf $O/t1_$rep $O/t2_$rep
    OMP_NUM_THREADS=2 .venv/bin/python -m foresight train e2e $common steps=16 out_dir=$O/t1_$rep > $O/t1_$rep.log 2>&1
    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 .venv/bin/python -m foresight launch --nproc-per-node 2 --master-port 2984$rep \
        train e2e $common steps=8 lr=2.0e-4 out_dir=$O/t2_$rep > $O/t2_$rep.log 2>&1
    for d in t1_$rep t2_$rep; do
        echo "$d $(.venv/bin/python -c "import json; print(json.load(open('$O/$d/summary.json'))['train']['seconds'])")"
    done
done
