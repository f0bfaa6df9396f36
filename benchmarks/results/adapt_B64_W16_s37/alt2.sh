#!/usr/bin/env bash
# session 37 (issue 13): a second alternation cycle. Session 37's system (session 30's cycle-2 adapter with the mean
# of three scorers trained for it, runs/quality/avg3_a30b_B64_W16) removed 49.8% of the gap top-k (half needs
# 1.0821; it got 1.0823). The next cycle trains the adapter on under that very scorer, then retrains the scorer
# for the new adapted model, with the same composition:
#   1. adapter: init_adapter=adapt_s30b, scorer=avg3_a30b (train adapt accepts a scorer made for its init adapter
#      since 232088b), session 30's cycle-2 settings (LoRA r=16 alpha=32 on q/k/v/o/gate/up/down, 96 steps, lr 3e-4,
#      KL only), data order seed 2 (cycles 1 and 2 used 0 and 1); ~40 min;
#   2. golden labels of the 336 training traces replayed by the new adapted model; ~5 min;
#   3. three scorers for it, the packaged composition (round 3 of a seed-0 run, rounds 3 and 4 of a seed-1 run of
#      benchmarks/quality/train_sl.sh with adapter=...), averaged; ~1 h 40 min (each run's rows are deleted once
#      its scorers are saved: 22-29 GB each);
#   4. measured like avg3.sh: adapt_eval.py --adapted-scorer on the 48 held-out traces, top-k and sampled T=0.005.
# Decision rule, fixed and committed before any number (avg3.sh's):
#   * issue 13's target is met under top-k only if the system removes >= 50% of the base's gap to 1.0 with the
#     paired interval below zero, and the full-cache CE stays within 1% of the base's (this cycle changes the
#     adapter, so the CE is measured anew);
#   * "the second cycle helps" only if the system beats session 37's (adapt_s37_eval_B64*) at both selections with
#     one paired interval below zero (adapt_compare --systems).
# About 2 h 30 min on 2 cores alone; every stage resumes (rerun the script).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=${E:-runs/quality}; PY=${PY:-.venv/bin/python}; S=foresight/scorers/smollm2-135m-b64-w16 R=benchmarks/results/adapt_B64_W16_s37
A1=$E/adapt_s30b_B64/adapter S1=$E/avg3_a30b_B64_W16 O=$E/adapt_s37c3_B64 A2=$E/adapt_s37c3_B64/adapter
L=$E/golden_train_B64_W16_a37 F=$E/features_a37 SL0=$E/sl_a37_B64_W16 SL1=$E/sl_a37_B64_W16_seed1 AVG=$E/avg3_a37_B64_W16
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$HOME/.cache/torch_extensions OMP_NUM_THREADS=1
for f in $A1/adapter_config.json $S1/config.json $E/train_traces/plan.json $E/adapt_s37_eval_B64/adapt_eval.json \
         $E/adapt_s37_eval_B64_sampled/adapt_eval.json; do
  [ -f $f ] || { echo "adapt_B64_W16_s37/alt2.sh: error: $f missing (run avg3.sh first)" >&2; exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "1. adapter, cycle 3 under the scorer made for cycle 2"
resume=""; [ -d $O/checkpoints ] && resume="--resume"
[ -f $A2/adapter_config.json ] || $PY -m torch.distributed.run --nproc_per_node 2 --master_port 29833 \
  -m foresight train adapt --config configs/adapt.yaml traces=$E/train_traces heldout_traces=$E/heldout_traces \
  policy=learned scorer=$S1 budget=64 interval=16 eval_policies=[] lora_r=16 lora_alpha=32 \
  "target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]" eval_before=false eval_traces=8 \
  steps=96 lr=3e-4 seed=2 init_adapter=$A1 checkpoint_every=24 out_dir=$O $resume
stamp "2. golden labels (new adapted model)"
two_ranks $PY -m foresight golden --adapter $A2 --allow-other-model --traces $E/train_traces --out $L \
    --budget 64 --interval 16 --no-progress
stamp "3. scorers for the new adapted model"
run() {  # out dir, rounds, extra keys
  local sl=$1 rounds=$2; shift 2
  [ -f $sl/rounds/round-$rounds/scorer/config.json ] || E=$E PY=$PY PORT=29835 bash benchmarks/quality/train_sl.sh \
      64 16 $sl adapter=$A2 labels=$L feature_cache=$F dagger_rounds=$rounds "$@"
  rm -rf $sl/rounds/round-*/rows   # only an extension past $rounds would read them
}
run $SL0 3
run $SL1 4 seed=1
[ -f $AVG/config.json ] || $PY benchmarks/average_scorers.py --out $AVG $SL0/rounds/round-3/scorer \
    $SL1/rounds/round-3/scorer $SL1/rounds/round-4/scorer
stamp "4. measure"
measure() {  # out dir, extra args
  local out=$1; shift
  [ -f $out/adapt_eval.json ] || $PY benchmarks/adapt_eval.py --adapter $A2 --traces $E/heldout_traces \
    --policies learned --scorer $S --other-scorer --adapted-scorer $AVG --budget 64 --interval 16 --out $out "$@"
}
measure $E/adapt_s37c3_eval_B64 --policy-arg selection=topk --policy-arg age_prior=0 > $E/adapt_s37c3_eval_B64.log 2>&1 & p1=$!
measure $E/adapt_s37c3_eval_B64_sampled --policy-arg selection=sample --policy-arg temperature=0.005 \
  > $E/adapt_s37c3_eval_B64_sampled.log 2>&1 & p2=$!
wait $p1; wait $p2
for s in "" _sampled; do
  cp $E/adapt_s37c3_eval_B64$s/adapt_eval.json $R/c3_eval_B64$s.json; cp $E/adapt_s37c3_eval_B64$s/adapt_eval.md $R/c3_eval_B64$s.md
  $PY benchmarks/adapt_compare.py $E/adapt_s37c3_eval_B64$s/adapt_eval.json $E/adapt_s37_eval_B64$s/adapt_eval.json \
    --systems --json $R/c3_vs_s37$s.json --md $R/c3_vs_s37$s.md
done
stamp done
