#!/usr/bin/env bash
# session 45: the scorer sees how recent queries' *content* points at each entry (feature group `query`, new).
#
# Why: every attention feature the scorer has is softmax attention of past queries, which RoPE tilts toward nearby
# tokens; golden keeps old entries (the problem statement's numbers, an earlier result) that the future re-reads, and
# their current attention says little about that, which is where the learned scorer loses most (long traces,
# session 22). `query` gives, per query head, the mean and the max over the last W queries of q.k/sqrt(d) with both
# rotated back to pre-RoPE: the affinity of content without the distance decay (kvpress's ExpectedAttentionPress
# estimates future attention from recent query statistics likewise).
#
# Run: the recipe's SL + three DAgger rounds at beta 0.5 (benchmarks/quality/train_sl.sh 64 16, seed 0, every other
# setting the packaged recipe's) with feature_set=[prekey,value,attn,age,query]. Measured on session 31's 48
# validation traces: round 3 top-k and sampled at T = 0.003, 0.005, 0.007 and 0.01 (a scorer with other features
# has its own score scale, session 44, so it gets a small temperature grid as the recipe's scorer did when its T=0.005
# was chosen on these traces in session 31).
# Reference: the recipe's own round 3 of seed 0, committed in benchmarks/results/temperature_s31/B64/quality.json
# (its best sampled, t005 1.2219; topk 1.2708).
# Rule, fixed before any number: the query features help if round 3's best sampled temperature of the four is lower
# than the reference's t005 with the paired interval (by problem) below zero, and its top-k is not worse (the paired
# interval against the reference's topk not above zero). If it passes, the next step is the other trace sets (the
# benchmark, the 16 unused problems, their 48 more traces, AIME) and a second seed before any change of the packaged
# scorer; if it fails, `query` stays an option reported as not helping.
# Needs runs/quality/{train_traces,golden_train_B64_W16,val_traces}; builds runs/quality/features if missing.
# Outputs under $O (default runs/s45). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s45} R=benchmarks/results/query_s45
Q=benchmarks/results/temperature_s31/B64/quality.json
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "SL + 3 DAgger rounds, feature_set=[prekey,value,attn,age,query]"
[ -f $O/query/rounds/round-3/scorer/config.json ] || E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 \
    $O/query "feature_set=[prekey,value,attn,age,query]"
cp $O/query/metrics.jsonl $R/metrics_query.jsonl
stamp "validation, round 3"
E=$E PY=$PY bash benchmarks/quality/vs_recipe_r3_grid.sh $O/query/rounds/round-3/scorer $O/v_r3 $R/validation_compare.txt
stamp done
