#!/usr/bin/env bash
# session 32: once rounds.sh has trained round 4 (session 32 rebuilt its labels and rounds from scratch), measure
# round 3 vs round 4 of that run, both sampled at T=0.005 (the packaged B=64 temperature): first on the validation
# traces of temperature_s31/sweep.sh (the decision set, paired by problem; also round 3 vs the packaged scorer there),
# then on the 48 benchmark traces. Outputs under $O (default runs/s32).
set -uo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality SL=$E/sl_B64_W16_prekey_r4 PY=.venv/bin/python O=${O:-runs/s32}
[ -f $SL/scorer/config.json ] || { echo "round4_s32.sh: error: no finished round 4 in $SL (run rounds.sh first)" >&2; exit 2; }
ev() {  # round traces out
  [ -f $O/$3/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $2 \
    --policies learned --scorer $SL/rounds/round-$1/scorer --budget 64 --interval 16 --batch-size 4 \
    --policy-arg selection=sample --policy-arg temperature=0.005 --out $O/$3 --quiet
}
echo "== $(date -u +%FT%TZ) validation"
ev 3 $E/val_traces val_r3 & p1=$!; ev 4 $E/val_traces val_r4 & p2=$!; wait $p1; wait $p2
$PY benchmarks/quality/compare.py $O/val_r4/fidelity.json:learned $O/val_r3/fidelity.json:learned --budget 64 --interval 16 \
  --by-problem --gap $E/tsweep_B64/quality.json:tova
$PY benchmarks/quality/compare.py $O/val_r3/fidelity.json:learned $E/tsweep_B64/quality.json:t005 --budget 64 --interval 16 \
  --by-problem --gap $E/tsweep_B64/quality.json:tova
echo "== $(date -u +%FT%TZ) benchmark"
ev 3 $E/heldout_traces held_r3 & p1=$!; ev 4 $E/heldout_traces held_r4 & p2=$!; wait $p1; wait $p2
G=benchmarks/results/quality_B64_recipe336/quality.json:tova
$PY benchmarks/quality/compare.py $O/held_r4/fidelity.json:learned $O/held_r3/fidelity.json:learned --budget 64 --interval 16 --gap $G
echo "== $(date -u +%FT%TZ) done"
