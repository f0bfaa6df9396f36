#!/usr/bin/env bash
# session 42: which selection should the `learned` policy run by default for each packaged scorer? Until now top-k
# (with the scorer's recorded top-k defaults) for both, while every table has carried both selections. This script
# measures nothing new: it pairs, per trace, the packaged scorer's committed sampled runs (its recorded temperature)
# with its committed runs at its recorded top-k defaults, on all five trace sets measured so far.
#
# Rule (written after the pooled numbers of every set were already in the README, so it is a stated criterion, not a
# pre-registration): a scorer records selection=sample as its default only if sampled points lower than its top-k
# default on all five sets (the mean of per-trace ratios; validation and the 48 extra16x3 traces paired by problem)
# and none of the five intervals lies above zero. Otherwise top-k stays its default.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=.venv/bin/python R=benchmarks/results F=fidelity.json:learned
cmp() { echo "# $1  -  $2"; $PY benchmarks/quality/compare.py "$@"; }
{
  echo "## B=64: sampled T=0.005 - top-k (spread 0.005)"
  cmp $R/ensemble_s33/val_avg3_t005/$F $R/momentum_s40/v64_s005/$F --budget 64 --interval 16 --by-problem \
    --gap $R/temperature_s31/B64/quality.json:tova
  cmp $R/ensemble_s33/held_t005/$F $R/momentum_s40/held64_s/$F --budget 64 --interval 16 \
    --gap $R/quality_B64_recipe336/quality.json:tova
  cmp $R/ensemble_s33/x16_t005/$F $R/spread_s41/x16_64/$F --budget 64 --interval 16 \
    --gap $R/quality_B64_recipe336/extra16/quality.json:tova
  cmp $R/ensemble_s33/x16x3_t005/$F $R/momentum_s40/x16x3_64_s/$F --budget 64 --interval 16 --by-problem \
    --gap $R/extra16x3_s31/B64/quality.json:tova
  cmp $R/ensemble_s33/aime_t005/$F $R/momentum_s40/aime64_s/$F --budget 64 --interval 16 \
    --gap $R/quality_B64_aime/quality.json:tova
  echo "## B=128: sampled T=0.003 - top-k (spread 0.005, newcomer bonus 0.012)"
  cmp $R/temperature_s31/B128/quality.json:t003 $R/spread_s41/v128_nb012/$F --budget 128 --interval 32 --by-problem \
    --gap $R/temperature_s31/B128/quality.json:tova
  cmp $R/quality_B128_prekey_dagger/ev128_prekey_sample/$F $R/spread_s41/nb_held128/$F --budget 128 --interval 32 \
    --gap $R/quality_B128_recipe336/quality.json:tova
  cmp $R/quality_B128_prekey_dagger/ev128_x16_prekey_sample/$F $R/spread_s41/x16_128/$F --budget 128 --interval 32 \
    --gap $R/quality_B128_recipe336/extra16/quality.json:tova
  cmp $R/extra16x3_s31/B128/quality.json:sample $R/spread_s41/nb_x16x3_128/$F --budget 128 --interval 32 --by-problem \
    --gap $R/extra16x3_s31/B128/quality.json:tova
  cmp $R/quality_aime_packaged/quality.json:packaged_sample $R/spread_s41/nb_aime128/$F --budget 128 --interval 32 \
    --gap $R/quality_aime_packaged/quality.json:tova
} | tee $R/selection_s42/compare.txt
