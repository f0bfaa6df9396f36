#!/usr/bin/env bash
# session 45, step 2 (runs only if oracle.sh's gate passed): the packaged recipe trained on output-measure labels.
#
# Run: golden labels of the 336 training traces at B=64/W=16 with `--measure output`; the recipe's SL + three DAgger
# rounds at beta 0.5 (benchmarks/quality/train_sl.sh 64 16, seed 0, every other setting the packaged recipe's) on
# them, with its own feature cache (the golden trajectory differs, so do the cached events). Measured on session 31's
# 48 validation traces: round 3 top-k and sampled at T = 0.003, 0.005, 0.007 and 0.01 (a scorer trained on other
# targets has its own score scale, session 44, so it gets a small temperature grid as the recipe's scorer did when its
# T=0.005 was chosen on these traces in session 31).
# Reference: the recipe's own round 3 of seed 0, committed in benchmarks/results/temperature_s31/B64/quality.json
# (its best sampled, t005 1.2219; topk 1.2708).
# Rule, fixed before any number: output labels help if round 3's best sampled temperature of the four is lower than
# the reference's t005 with the paired interval (by problem) below zero, and its top-k is not worse (the paired
# interval against the reference's topk not above zero). If it passes, the next step is the other trace sets (the
# benchmark, the 16 unused problems, their 48 more traces, AIME) before any change of the packaged scorer.
# Needs runs/quality/{train_traces,val_traces}. Outputs under $O (default runs/s45). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s45} R=benchmarks/results/output_oracle_s45
Q=benchmarks/results/temperature_s31/B64/quality.json
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "output-measure golden labels of the training traces"
two_ranks $PY -m foresight golden --traces $E/train_traces --out $E/golden_train_B64_W16_output --budget 64 \
    --interval 16 --measure output --no-progress
stamp "SL + 3 DAgger rounds on output labels"
[ -f $O/output/rounds/round-3/scorer/config.json ] || E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 \
    $O/output labels=$E/golden_train_B64_W16_output feature_cache=$E/features_output
cp $O/output/metrics.jsonl $R/metrics_output.jsonl
stamp "validation, round 3"
E=$E PY=$PY bash benchmarks/quality/vs_recipe_r3_grid.sh $O/output/rounds/round-3/scorer $O/v_r3 $R/validation_compare.txt
stamp done
