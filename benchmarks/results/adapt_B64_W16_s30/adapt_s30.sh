#!/usr/bin/env bash
# session 30 (issue 13): session 13's adapter recipe (LoRA r=16, alpha=32 on q/k/v/o + gate/up/down, lr 1e-3 cosine,
# 160 steps, KL only, 2 ranks x 1 trace) trained under the packaged B=64 scorer (pre-RoPE, three DAgger rounds,
# SHA-256 154ce316...) instead of session 12's; then a second cosine cycle from it (session 18's move: lr 3e-4, 96
# steps, data order seed 1). Each adapter is measured on the 48 held-out traces (top-k; the first also sampled) and
# compared as a system with session 13's (adapt_compare.py --systems: the base sides evict with different scorers).
# Needs the quality recipe's traces (`HELDOUT=48 bash benchmarks/quality/recipe.sh` up to "training traces": 29 min).
# Every stage skips what exists and training resumes (--resume) after a kill: rerun the script.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; S=benchmarks/results/quality_B64_prekey_dagger/scorer
R=benchmarks/results/adapt_B64_W16_s30; S13=benchmarks/results/adapt_B64_W16_s13
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
adapt() {  # out_dir, master port, extra keys
  local out=$1 port=$2; shift 2
  local resume=""; [ -d $out/checkpoints ] && resume="--resume"
  [ -f $out/adapter/adapter_config.json ] || $PY -m torch.distributed.run --nproc_per_node 2 --master_port $port \
    -m foresight train adapt --config configs/adapt.yaml traces=$E/train_traces heldout_traces=$E/heldout_traces \
    policy=learned scorer=$S budget=64 interval=16 eval_policies=[] lora_r=16 lora_alpha=32 \
    "target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]" \
    eval_before=false eval_traces=8 out_dir=$out "$@" $resume
}
measure() {  # adapter dir, out dir, extra args
  local a=$1 out=$2; shift 2
  [ -f $out/adapt_eval.json ] || OMP_NUM_THREADS=2 $PY benchmarks/adapt_eval.py --adapter $a/adapter \
    --traces $E/heldout_traces --policies learned --scorer $S --budget 64 --interval 16 --out $out "$@"
}
stamp "cycle 1 (40 min on 2 ranks)"
adapt $E/adapt_s30_B64 29831 steps=160 lr=1e-3 checkpoint_every=20
stamp "cycle 1 measured (10 + 5 min)"
measure $E/adapt_s30_B64 $E/adapt_s30_eval_B64
measure $E/adapt_s30_B64 $E/adapt_s30_eval_B64_sampled --policy-arg selection=sample --policy-arg temperature=0.003
for m in "" _sampled; do
  $PY benchmarks/adapt_compare.py $E/adapt_s30_eval_B64$m/adapt_eval.json $S13/eval_B64$m.json --systems \
    --json $R/s30_vs_s13$m.json --md $R/s30_vs_s13$m.md
done
stamp "cycle 2 (96 steps)"
adapt $E/adapt_s30b_B64 29832 steps=96 lr=3e-4 seed=1 init_adapter=$E/adapt_s30_B64/adapter checkpoint_every=24
stamp "cycle 2 measured"
measure $E/adapt_s30b_B64 $E/adapt_s30b_eval_B64
measure $E/adapt_s30b_B64 $E/adapt_s30b_eval_B64_sampled --policy-arg selection=sample --policy-arg temperature=0.003
for m in "" _sampled; do
  $PY benchmarks/adapt_compare.py $E/adapt_s30b_eval_B64$m/adapt_eval.json $E/adapt_s30_eval_B64$m/adapt_eval.json \
    --json $R/s30b_vs_s30$m.json --md $R/s30b_vs_s30$m.md
done
stamp done
# committed copies: eval_B64*.json/md and metrics, configs of cycle 1 here, of cycle 2 under cycle2/
