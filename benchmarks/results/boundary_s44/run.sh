#!/usr/bin/env bash
# session 44: the ranking loss counts only the pairs across the oracle's evict/keep boundary
# (`pair_weight=boundary`, new).
#
# Why: every packaged scorer trains with `pair_weight=gap`, which weights each ordered pair (i, j), alpha_i < alpha_j,
# by alpha_j - alpha_i, LambdaRank's "metric change of a swap". But an eviction removes the lowest-scored entries, so
# swapping two entries on the same side of the oracle's boundary (both kept, or both evicted) changes nothing it
# removes: their metric change is zero, yet under `gap` the pairs among kept entries (the sinks and the heavily
# attended entries, whose alpha differences are the largest) carry most of a row's weight. `boundary` keeps the gap
# weight for pairs with i in the oracle's evict set and j outside it, and no others.
#
# Run: the recipe's SL + three DAgger rounds at beta 0.5 (benchmarks/quality/train_sl.sh 64 16, seed 0, every other
# setting the packaged recipe's) with pair_weight=boundary; then, as a screen only, the recipe's round 0 (plain SL,
# pair_weight=gap, seed 0) retrained alone so that round 0 of both losses can be compared too. Measured on session
# 31's 48 validation traces (8 problems held out inside training) at both selections.
# Reference: the recipe's own round-3 scorer of the same seed (top-k rounds, gap pairs), committed in
# benchmarks/results/temperature_s31/B64/quality.json (stages t005: sampled T=0.005 1.2219; topk: plain top-k 1.2708).
# Rule, fixed before any number: the boundary loss helps if its round 3, evaluated sampled at T=0.005 (the B=64
# default), is lower than that reference with the paired interval (by problem) below zero. Top-k and the round-0
# pair are reported, not part of the rule. If the rule passes, the next step is the other sets and an ensemble of
# such runs against the packaged ensemble (one run is a draw, session 34), not yet a change of the packaged scorer;
# if it fails, `boundary` stays an option reported as not helping.
# Needs runs/quality/{train_traces,golden_train_B64_W16,val_traces,features}. Outputs under $O (default runs/s44).
# Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s44} R=benchmarks/results/boundary_s44
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "SL + 3 DAgger rounds, pair_weight=boundary"
[ -f $O/boundary/rounds/round-3/scorer/config.json ] || E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 \
    $O/boundary pair_weight=boundary
stamp "validation, round 3 against the recipe's round 3"
E=$E PY=$PY bash benchmarks/quality/vs_recipe_r3.sh $O/boundary/rounds/round-3/scorer $O/v_r3 $R/validation_compare.txt
cp $O/boundary/metrics.jsonl $R/metrics_boundary.jsonl
stamp "round 0 of the gap loss (the recipe's SL) alone"
[ -f $O/sl_gap/scorer/config.json ] || E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 $O/sl_gap dagger_rounds=0
stamp "validation, round 0 of both losses"
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh "$1" $E/val_traces "$2" 64 16 "${@:3}"; }
for s in boundary:$O/boundary/rounds/round-0/scorer gap:$O/sl_gap/scorer; do
    n=${s%%:*} d=${s#*:}
    ev $d $O/v_r0_${n}_topk --policy-arg selection=topk & p1=$!
    ev $d $O/v_r0_${n}_t005 --policy-arg selection=sample --policy-arg temperature=0.005 & p2=$!
    wait $p1; wait $p2
done
F=fidelity.json:learned Q=benchmarks/results/temperature_s31/B64/quality.json
for sel in t005 topk; do
    $PY benchmarks/quality/compare.py $O/v_r0_boundary_$sel/$F $O/v_r0_gap_$sel/$F --budget 64 --interval 16 \
        --by-problem --gap $Q:tova
done | tee $R/round0_compare.txt
stamp done
