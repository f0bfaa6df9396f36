#!/usr/bin/env bash
# session 35: does twice the training data help the B=64 scorer? A second sample of each of the 336 training
# problems (`foresight trace --first-sample 1`: seed 0 as the first set, so these are sample 1 of the same sampling,
# ids problem#1), its golden labels at B=64/W=16, then the packaged members' recipe (benchmarks/quality/train_sl.sh:
# SL 2,400 steps + three DAgger rounds at beta 0.5, pre-RoPE features, seed 0) on both sets together (672 traces;
# split_seed unchanged, so the same 8 validation problems, both samples of each, stay held out).
# Decision rule, fixed before any number, on session 31's validation traces (48 traces of those 8 problems, paired by
# problem; sampled at T=0.005 and top-k):
#   * "more data helps" only if the final scorer (round 3) is lower than the one-sample recipe's round 3 (the scorer
#     packaged in sessions 26-32, same seed: temperature_s31's sweep) at both selections with at least one interval
#     below zero; the other one-sample round-3 draw (session 34's seed 1) is printed beside;
#   * it replaces or joins the packaged three-run mean only if it also beats that (ensemble_s33's runs) by the same
#     rule; only then STAGE=beyond measures the other sets.
# About 2 h on 2 cores alone (traces 30 min, labels 5, features 10, SL 5, rounds about 25 each). Every stage resumes
# when rerun.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s35}
T1=$E/train_traces_s1 L1=$E/golden_train_s1_B64_W16 SL=$E/sl_B64_W16_prekey_data2x
S31=benchmarks/results/temperature_s31/B64/quality.json S33=benchmarks/results/ensemble_s33
S34=benchmarks/results/ensemble_s34/alone
export OMP_NUM_THREADS=1
for f in $E/split/train.jsonl $E/train_traces/plan.json $E/golden_train_B64_W16/plan.json $E/val_traces/plan.json \
         $S31 $S33/val_avg3_t005/fidelity.json $S34/val64_s1r3_topk/fidelity.json; do
  [ -f $f ] || { echo "data2x_s35/run.sh: error: $f missing (run benchmarks/quality/recipe.sh, temperature_s31/sweep.sh, ensemble_s33/run.sh and ensemble_s34/alone.sh first)" >&2; exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "second sample of the training problems"
two_ranks $PY -m foresight trace --model smollm2-135m --data $E/split/train.jsonl --max-new-tokens 512 --batch-size 16 \
    --seed 0 --first-sample 1 --out $T1 --no-progress
stamp "golden labels B=64 W=16"
two_ranks $PY -m foresight golden --traces $T1 --out $L1 --budget 64 --interval 16 --no-progress
stamp "SL + 3 DAgger rounds on both sets"
[ -f $SL/scorer/config.json ] || E=$E PY=$PY PORT=29815 bash benchmarks/quality/train_sl.sh 64 16 $SL \
    "traces=[$E/train_traces,$T1]" "labels=[$E/golden_train_B64_W16,$L1]"
stamp validation
mkdir -p $O
ev() {  # scorer traces out [sample]
  local extra=(); [ "${4:-}" = sample ] && extra=(--policy-arg selection=sample --policy-arg temperature=0.005)
  [ -f $O/$3/fidelity.json ] || $PY -m foresight eval fidelity --model smollm2-135m --traces $2 \
    --policies learned --scorer $1 --budget 64 --interval 16 --batch-size 4 "${extra[@]}" --out $O/$3 --quiet
}
cmp() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16; }
ev $SL/scorer $E/val_traces val_d2x_t005 sample & p1=$!; ev $SL/scorer $E/val_traces val_d2x_topk & p2=$!
wait $p1; wait $p2
G=$S31:tova F=fidelity.json:learned
{ echo "# 2x data round 3 vs the one-sample round 3 (packaged 26-32, same seed)"
  cmp $O/val_d2x_t005/$F $S31:t005 --by-problem --gap $G
  cmp $O/val_d2x_topk/$F $S31:topk --by-problem --gap $G
  echo "# vs the other one-sample round-3 draw (session 34, seed 1)"
  cmp $O/val_d2x_t005/$F $S34/val64_s1r3_sample/$F --by-problem
  cmp $O/val_d2x_topk/$F $S34/val64_s1r3_topk/$F --by-problem
  echo "# vs the packaged three-run mean"
  cmp $O/val_d2x_t005/$F $S33/val_avg3_t005/$F --by-problem --gap $G
  cmp $O/val_d2x_topk/$F $S33/val_avg3_topk/$F --by-problem --gap $G
} | tee $O/validation_compare.txt
stamp done
