#!/usr/bin/env bash
# The experiment scripts' one comparison beyond the validation traces, at B=64/W=16: a scorer's runs on the
# benchmark's 48 held-out traces, the 16 unused problems, 48 more traces of them and 60 AIME traces, sampled at
# T=0.005 and top-k (DIR/{held,x16,x16x3,aime}_{t005,topk}/fidelity.json), each paired with the recipe's own round 3
# of seed 0 (the packaged B=64 scorer of sessions 26-32), whose runs on those sets are committed. Prints eight
# compare.py results, in that order.
#
#   bash benchmarks/quality/beyond_vs_recipe_r3.sh DIR
#
# Environment: PY (default .venv/bin/python).
set -euo pipefail
[ $# -eq 1 ] || { echo "beyond_vs_recipe_r3.sh: error: usage: beyond_vs_recipe_r3.sh DIR" >&2; exit 2; }
O=$1 PY=${PY:-.venv/bin/python} R=benchmarks/results F=fidelity.json:learned
T=$R/temperature_s31 D=$R/quality_B64_prekey_dagger Q3=$R/extra16x3_s31/B64/quality.json
GH=$R/quality_B64_recipe336/quality.json:tova GX=$R/quality_B64_recipe336/extra16/quality.json:tova
GA=$R/quality_B64_aime/quality.json:tova
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
cmp $O/held_t005/$F $T/B64_t005_held/$F --gap $GH
cmp $O/held_topk/$F $T/B64_topk_held/$F --gap $GH
cmp $O/x16_t005/$F $T/B64_t005_x16/$F --gap $GX
cmp $O/x16_topk/$F $D/extra16/r3/$F --gap $GX
cmp $O/x16x3_t005/$F $Q3:sample --gap $Q3:tova --by-problem
cmp $O/x16x3_topk/$F $Q3:topk --gap $Q3:tova --by-problem
cmp $O/aime_t005/$F $T/B64_t005_aime/$F --gap $GA
cmp $O/aime_topk/$F $R/quality_aime_packaged/ev64/$F --gap $GA
