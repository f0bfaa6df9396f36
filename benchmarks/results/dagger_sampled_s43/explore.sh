#!/usr/bin/env bash
# session 43, third question: do rounds that explore help? run.sh's sampled rounds at T=0.005 (the B=64 deployment
# temperature) were level with the top-k rounds; at T=0.02 (4x) the scorer's replays stray further from its top-k
# trajectory, so the oracle labels states a deterministic scorer never reaches (exploration in the DAgger rounds).
#
# Run: as run.sh with dagger_temperature=0.02 (the recipe: SL + three rounds at beta 0.5, seed 0).
# Rule, fixed before any number: exploring rounds help if round 3, evaluated sampled at T=0.005 (the B=64 default), is
# lower than the recipe's own round 3 of the same seed (benchmarks/quality/vs_recipe_r3.sh) with the paired interval
# (by problem) below zero; top-k is reported, not part of the rule. If it passes, the next step is a seed check and an
# ensemble against the packaged one; if not, dagger_temperature stays at its default 0.
# Needs run.sh's inputs. Outputs under $O (default runs/s43). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s43} R=benchmarks/results/dagger_sampled_s43
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
stamp "SL + 3 DAgger rounds, sampled rounds at T=0.02"
[ -f $O/dagger_t02/rounds/round-3/scorer/config.json ] || E=$E PY=$PY PORT=29813 bash benchmarks/quality/train_sl.sh \
    64 16 $O/dagger_t02 dagger_temperature=0.02
stamp "validation"
E=$E PY=$PY bash benchmarks/quality/vs_recipe_r3.sh $O/dagger_t02/rounds/round-3/scorer $O/v_t02r3 \
    $R/explore_compare.txt
cp $O/dagger_t02/metrics.jsonl $R/metrics_dagger_t02.jsonl
stamp done
