#!/usr/bin/env bash
# session 43: DAgger rounds that follow the scorer's *sampled* trajectory (`dagger_temperature=0.005`, new).
#
# Why: since session 42 the packaged B=64 scorer evicts by sampling (Plackett-Luce at T=0.005) by default, but every
# DAgger round so far replayed the training traces with the scorer's top-k, so the caches the rounds taught it were
# those of a selection it is no longer deployed with. With dagger_temperature=T the scorer's evictions in those
# replays are the learned policy's selection=sample draw at T (training/onpolicy.py; seeded per seed, round, trace).
#
# Run: the recipe's SL + three DAgger rounds at beta 0.5 (benchmarks/quality/train_sl.sh 64 16, seed 0, everything
# else the packaged recipe's settings) with dagger_temperature=0.005, measured on session 31's 48 validation traces
# (8 problems held out inside training) at both selections.
# Reference: the recipe's own round-3 scorer of the same seed (top-k rounds), the packaged B=64 scorer of sessions
# 26-32 (benchmarks/results/quality_B64_prekey_dagger/scorer, SHA-256 154ce316...), whose validation runs are committed
# in benchmarks/results/temperature_s31/B64/quality.json (stages t005: sampled T=0.005 1.2219; topk: plain top-k 1.2708).
# Rule, fixed before any number: sampled rounds help if round 3, evaluated sampled at T=0.005 (the selection the rounds
# follow and the B=64 default), is lower than that reference with the paired interval (by problem) below zero. The
# top-k comparison is reported, not part of the rule. If the rule passes, the next step is an ensemble of
# sampled-round runs against the packaged ensemble (one run is a draw, session 34), not a change of the packaged
# scorer; if it fails, dagger_temperature stays an option, reported as not helping.
# Needs runs/quality/{train_traces,golden_train_B64_W16,val_traces,features} (see runs/s42/traces.sh and
# benchmarks/results/temperature_s31/sweep.sh). Outputs under $O (default runs/s43). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s43} R=benchmarks/results/dagger_sampled_s43
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "SL + 3 DAgger rounds, sampled rounds at T=0.005"
[ -f $O/dagger_t005/rounds/round-3/scorer/config.json ] || E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 \
    $O/dagger_t005 dagger_temperature=0.005
stamp "validation"
E=$E PY=$PY bash benchmarks/quality/vs_recipe_r3.sh $O/dagger_t005/rounds/round-3/scorer $O/v_r3 $R/validation_compare.txt
cp $O/dagger_t005/metrics.jsonl $R/metrics_dagger_t005.jsonl
stamp done
