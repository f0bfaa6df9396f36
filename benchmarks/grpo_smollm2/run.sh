#!/usr/bin/env bash
# Issue 7 acceptance run on the default model (SmolLM2-135M, CPU): MATH-500 traces -> golden labels at B=64, W=16
# -> SL scorer -> GRPO from it, then a paired per-trace comparison of the two scorers on the held-out traces.
# Usage: bash benchmarks/grpo_smollm2/run.sh   (outputs under $E, default runs/exp7; about 60 min on 2 quiet CPU cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
export E=${E:-runs/exp7}
HERE=benchmarks/grpo_smollm2
$PY -m foresight trace --model smollm2-135m --data math500 --limit 48 \
    --max-new-tokens 512 --batch-size 8 --seed 0 --out $E/traces --no-progress
$PY -m foresight golden --traces $E/traces --out $E/golden_B64_W16 --budget 64 --interval 16 --no-progress
resume() { [ -d $1/checkpoints ] && echo --resume || true; }   # a rerun continues each training run
$PY -m foresight train sl --config configs/sl.yaml traces=$E/traces labels=$E/golden_B64_W16 budget=64 \
    interval=16 out_dir=$E/sl heldout=12 steps=300 fidelity_policies='[streaming_llm,h2o,golden]' $(resume $E/sl)
# Plackett-Luce temperature: how far G=8 sampled evict sets stray from top-k, and their reward, per temperature
$PY $HERE/probe.py 0.003 0.01 0.03
# GRPO (T=0.003: ~19% of each evict set differs from top-k)
$PY -m foresight train grpo --config configs/grpo.yaml traces=$E/traces init_scorer=$E/sl/scorer heldout=12 \
    group_size=8 temperature=0.003 lr=1e-4 steps=60 inner_epochs=2 checkpoint_every=10 keep_checkpoints=0 \
    eval_group_size=8 out_dir=$E/grpo $(resume $E/grpo)
# paired per-trace comparison, with the evaluation's noise seed and a second one
$PY $HERE/compare.py sl,grpo60 $E/sl/scorer,$E/grpo/scorer
$PY $HERE/summarise.py
# the SL scorer at inference: top-k vs the learned policy's sampled selection (T=0.003, seeds 0 and 1)
$PY $HERE/sample_vs_topk.py sl $E/sl/scorer
