#!/usr/bin/env bash
# session 34: how strong is each seed-1 member on its own? Rounds 3 and 4 of the seed-1 rerun at B=128 (session 33,
# ../ensemble_s33/b128_rounds.sh; its three-member ensemble was level with the packaged scorer) or at B=64 (this
# folder's run.sh), each alone on session 31's validation traces, top-k and sampled at the packaged temperature
# (B=128 T=0.003, B=64 T=0.005), paired by problem against the packaged scorer's runs of the time (B=128: the
# packaged scorer in temperature_s31's sweep; B=64: the packaged avg3 in ../ensemble_s33).
# BUDGET=128 (default) or 64. About 12 min on 2 cores alone. Outputs under $O (default runs/s34; committed copies in
# alone/); rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s34} B=${BUDGET:-128}
case $B in
  128) W=32 T=0.003 R=$E/sl_B128_W32_prekey_seed1/rounds Q=$E/tsweep_B128/quality.json
       REF_TOPK=$Q:topk REF_SAMPLE=$Q:t003 tag=val128 ;;
  64)  W=16 T=0.005 R=$E/sl_B64_W16_prekey_seed1/rounds Q=$E/tsweep_B64/quality.json
       S33=benchmarks/results/ensemble_s33
       REF_TOPK=$S33/val_avg3_topk/fidelity.json:learned REF_SAMPLE=$S33/val_avg3_t005/fidelity.json:learned tag=val64 ;;
  *) echo "alone.sh: error: BUDGET must be 64 or 128, got $B" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=1
for f in $R/round-3/scorer/config.json $R/round-4/scorer/config.json $Q; do
  [ -f $f ] || { echo "alone.sh: error: $f missing (run the seed-1 rerun and temperature_s31/sweep.sh first)" >&2; exit 2; }
done
ev() {  # round out [sample]
  local extra=(); [ "${3:-}" = sample ] && extra=(--policy-arg selection=sample --policy-arg temperature=$T)
  [ -f $O/$2/fidelity.json ] || $PY -m foresight eval fidelity --model smollm2-135m --traces $E/val_traces \
    --policies learned --scorer $R/round-$1/scorer --budget $B --interval $W --batch-size 4 "${extra[@]}" --out $O/$2 --quiet
}
mkdir -p $O
ev 3 ${tag}_s1r3_topk & p1=$!; ev 4 ${tag}_s1r4_topk & p2=$!; wait $p1; wait $p2
ev 3 ${tag}_s1r3_sample sample & p1=$!; ev 4 ${tag}_s1r4_sample sample & p2=$!; wait $p1; wait $p2
{ for r in 3 4; do
    $PY benchmarks/quality/compare.py $O/${tag}_s1r${r}_topk/fidelity.json:learned $REF_TOPK --budget $B --interval $W --by-problem --gap $Q:tova
    $PY benchmarks/quality/compare.py $O/${tag}_s1r${r}_sample/fidelity.json:learned $REF_SAMPLE --budget $B --interval $W --by-problem --gap $Q:tova
  done; } | tee $O/alone_B${B}_compare.txt
