#!/usr/bin/env bash
# A small run of the quality recipe on the default model (CPU): 40 training problems and 16 of the fixed held-out
# problems of benchmarks/quality/heldout_problems.txt, B=64/W=16: traces -> golden labels (/3) -> SL with two DAgger
# rounds (round 0 = plain SL) -> the quality benchmark (every heuristic, golden, SL, SL+DAgger) on the held-out
# traces. Every stage resumes when rerun. Usage: bash benchmarks/quality/small_recipe.sh  (outputs under $E)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
E=${E:-runs/quality_small}
$PY benchmarks/quality/split.py $E/split
$PY -m foresight trace --model smollm2-135m --data $E/split/train.jsonl --limit 40 --max-new-tokens 512 \
    --batch-size 8 --seed 0 --out $E/train_traces --no-progress
$PY -m foresight trace --model smollm2-135m --data $E/split/heldout.jsonl --limit 16 --max-new-tokens 512 \
    --batch-size 8 --seed 0 --out $E/heldout_traces --no-progress
$PY -m foresight golden --traces $E/train_traces --out $E/golden_train_B64_W16 --budget 64 --interval 16 --no-progress
$PY -m foresight golden --traces $E/heldout_traces --out $E/golden_heldout_B64_W16 --budget 64 --interval 16 --no-progress
resume=""; [ -f $E/sl/rounds/dagger.json ] && resume="--resume"
$PY -m foresight train sl --config configs/sl.yaml traces=$E/train_traces labels=$E/golden_train_B64_W16 \
    budget=64 interval=16 heldout=4 steps=300 eval_fidelity=false dagger_rounds=2 dagger_beta=0.5 \
    out_dir=$E/sl $resume
$PY benchmarks/quality/run.py --model smollm2-135m --traces $E/heldout_traces \
    --setting 64:16=$E/golden_heldout_B64_W16 --scorer sl=$E/sl/rounds/round-0/scorer --scorer dagger=$E/sl/scorer \
    --out $E/quality
