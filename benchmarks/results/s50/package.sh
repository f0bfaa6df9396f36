#!/usr/bin/env bash
# session 50: check.sh's rule held (check.txt), so the packaged B=64 scorer, moved to the B=128/W=32 cache
# (`foresight export --budget 128 --interval 32`, new: its recent-query window stays the 16 it was trained with;
# weights byte-identical), becomes smollm2-135m-b128-w32. The scorer it replaces (session 28's pre-RoPE SL + three
# DAgger rounds; spread and newcomer bonus since sessions 40-41) is kept at benchmarks/results/s50/b128_s41 (moved
# there with git mv before this script ran; the earlier scripts that measured it now name that directory).
#   1. export the moved scorer to $O/moved (no card yet);
#   2. the benchmark split with it as `learned` runs it by default (top-k at its recorded spread 0.005 and age prior
#      0.01; it must equal check.sh's any_budget run trace for trace) and sampled at its recorded T=0.005;
#   3. the card (card.py) and the export with it into foresight/scorers/smollm2-135m-b128-w32.
# About 12 min on 2 cores alone; every evaluation resumes.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s50}; R=benchmarks/results
DST=foresight/scorers/smollm2-135m-b128-w32 SRC=foresight/scorers/smollm2-135m-b64-w16
[ -f $R/s50/held/fidelity.json ] || { echo "s50/package.sh: error: $R/s50/held missing (run s50/check.sh first)" >&2; exit 2; }
[ -f $R/s50/b128_s41/config.json ] || { echo "s50/package.sh: error: $R/s50/b128_s41 missing (git mv $DST there)" >&2; exit 2; }
NOTE="the packaged B=64 scorer (smollm2-135m-b64-w16, trained at B=64/W=16), moved to the B=128/W=32 cache by \
foresight export --budget 128 --interval 32 in session 50: its features keep the 16-query window it was trained \
with, its top-k defaults (spread 0.005, age prior 0.01) are the B=64 ones, nothing was tuned at B=128. Found on the \
48 1,024-cap validation traces (benchmarks/results/s50/transfer.sh: 53.6% of the tova->golden gap against the \
B=128 scorer's 49.6%, paired by problem -0.0136 [-0.0312, -0.0031]); the rule of s50/check.sh, committed before its \
numbers, held on the benchmark split, the 512-cap sets beyond it and 60 1,024-cap AIME traces (s50/check.txt). The \
scorer it replaced is kept at benchmarks/results/s50/b128_s41"
$PY -m foresight export $SRC --out $O/moved --overwrite --budget 128 --interval 32 --note "budget_note=$NOTE"
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh $O/moved $E/heldout_traces "$@"; }
ev $O/card_topk 128 32 & p1=$!; ev $O/card_t005 128 32 --policy-arg selection=sample & p2=$!; wait $p1; wait $p2
$PY - $O/card_topk/fidelity.json $R/s50/held/fidelity.json <<'PY'
import json, sys
a, b = ([r for r in json.load(open(f)) if r["policy"] == "learned"][0] for f in sys.argv[1:])
assert a["per_trace_ratio"] == b["per_trace_ratio"], "the moved scorer's top-k run differs from check.sh's transfer"
print(f"the moved scorer's default run equals check.sh's any_budget run on {len(a['per_trace_ratio'])} traces")
PY
for s in card_topk card_t005; do mkdir -p $R/s50/$s && cp $O/$s/{fidelity.json,fidelity.md,settings.json} $R/s50/$s/; done
$PY benchmarks/quality/card.py --budget 128 --interval 32 --topk $R/s50/card_topk/fidelity.json:learned \
    --sample $R/s50/card_t005/fidelity.json:learned --reference $R/quality_B128_recipe336/quality.json \
    --out $R/s50/card_B128.json
$PY -m foresight export $SRC --out $DST --overwrite --budget 128 --interval 32 --note "budget_note=$NOTE" \
    --fidelity $R/s50/card_B128.json
