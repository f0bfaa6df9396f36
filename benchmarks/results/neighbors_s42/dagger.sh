#!/usr/bin/env bash
# session 42, second stage of run.sh (whose rule passed at SL: nb − base on the validation traces, by problem, top-k
# −0.0274 [−0.0416, −0.0135], sampled T=0.005 −0.0113 [−0.0216, −0.0007]): the full recipe with `neighbors` (SL + three
# DAgger rounds at beta 0.5, seed 0, the packaged recipe's settings otherwise), measured on the same validation traces.
#
# Reference: the recipe's own single round-3 scorer of the same seed, the packaged B=64 scorer of sessions 26-32 (kept
# at benchmarks/results/quality_B64_prekey_dagger/scorer, SHA-256 154ce316...), whose validation runs are committed in
# benchmarks/results/temperature_s31/B64/quality.json (stages topk: plain top-k 1.2708; t005: sampled 1.2219).
# Rule, fixed before any number: if nb round 3 is lower than that scorer at both selections (plain top-k and T=0.005)
# with at least one paired interval (by problem) below zero, the next step is an ensemble of `neighbors` runs against
# the packaged ensemble (the packaged scorers are not changed by one run: a single recipe run is a draw, session 34).
# Otherwise `neighbors` stays opt-in, reported as helping at SL only.
# Needs run.sh's inputs. Outputs under $O (default runs/s42). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s42} R=benchmarks/results/neighbors_s42
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "SL + 3 DAgger rounds, neighbors"
[ -f $O/dagger_nb/rounds/round-3/scorer/config.json ] || E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 \
    $O/dagger_nb "feature_set=[prekey,value,attn,age,neighbors]"
stamp "validation"
E=$E PY=$PY bash benchmarks/quality/vs_recipe_r3.sh $O/dagger_nb/rounds/round-3/scorer $O/v_nbr3 $R/dagger_validation_compare.txt
cp $O/dagger_nb/metrics.jsonl $R/metrics_dagger_nb.jsonl
stamp done
