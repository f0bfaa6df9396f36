#!/usr/bin/env bash
# session 45, step 1 (a gate): is the oracle's *measure* the limit? Golden Eviction ranks entries by future
# attention (DESIGN.md section 3). What a query loses when entry i is evicted is not its attention p_i but how far its
# attention output moves: after the renormalisation o = sum_j p_j v_j becomes (o - p_i v_i)/(1 - p_i), a move of
# exactly p_i/(1 - p_i) * |v_i - o| (CAOTE, arXiv 2504.14051, for the newest query). `foresight golden --measure
# output` (new) puts that in place of p in the oracle's block averages over every future query; the greedy schedule,
# the per-event foresight values and everything downstream are unchanged.
#
# Run: golden labels of session 31's 48 validation traces (8 problems held out inside training) at B=64/W=16 with
# --measure output, replayed as the golden policy. Reference: the attention oracle's golden replay on the same traces,
# committed in benchmarks/results/temperature_s31/B64/quality.json (stage golden, 1.0756; tova 1.3502).
# Rule, fixed before any number: the output measure is a better target if its golden loss ratio is lower than the
# attention oracle's with the paired interval (by problem) below zero. Only then does step 2 (train.sh: the recipe
# trained on output labels) run; otherwise the measure stays an option reported as not a better oracle.
# Needs runs/quality/val_traces. Outputs under $O (default runs/s45). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s45} R=benchmarks/results/output_oracle_s45
Q=benchmarks/results/temperature_s31/B64/quality.json
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "output-measure golden labels of the validation traces"
two_ranks $PY -m foresight golden --traces $E/val_traces --out $E/golden_val_B64_W16_output --budget 64 --interval 16 \
    --measure output --no-progress
stamp "golden replay"
[ -f $O/val_golden_output/fidelity.json ] || $PY -m foresight eval fidelity --model smollm2-135m \
    --traces $E/val_traces --policies golden --golden $E/golden_val_B64_W16_output --budget 64 --interval 16 \
    --batch-size 4 --out $O/val_golden_output --quiet
$PY benchmarks/quality/compare.py $O/val_golden_output/fidelity.json:golden $Q:golden --budget 64 --interval 16 \
    --by-problem --gap $Q:tova | tee $R/oracle_compare.txt
stamp done
