#!/usr/bin/env bash
# sessions 23-24: the recipe's SL (B=64/W=16, 328 training traces, 2,400 steps per round, seed 0) with pre-RoPE keys
# (feature_set [prekey,value,attn,age]) and dagger_rounds=4 at beta 0.5 (halved each round), then top-k fidelity of
# each finished round's scorer on the 48 benchmark traces, a curve over rounds (round 0 is
# ../quality_B64_prekey/ev_held_prekey), and the last round's scorer sampled (T=0.003). Needs the recipe's traces,
# labels and feature cache (`HELDOUT=48 bash benchmarks/quality/recipe.sh` up to its SL stage). Every stage skips
# what exists and training resumes where it stopped: stop it after any round (session 24 stopped after round 2,
# about 50 min a round) and evaluate the rounds that are done with ROUNDS_DONE="1 2". Each round's rows take 19.7 GB:
# session 25 trained round 3, stopped before round 4 (its disk held the feature cache and three rounds; `train sl`
# now refuses a round that will not fit, before any work) and ran ROUNDS_DONE="1 2 3".
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; SL=$E/sl_B64_W16_prekey_r4; B=64; W=16
G="--budget $B --interval $W --gap benchmarks/results/quality_B64_recipe336/quality.json:tova"
resume=""; { [ -f $SL/rounds/dagger.json ] || [ -d $SL/checkpoints ]; } && resume="--resume"
[ -n "${ROUNDS_DONE:-}" ] || [ -f $SL/scorer/config.json ] || OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu $PY -m \
    torch.distributed.run --nproc_per_node 2 --master_port 29811 -m foresight train sl --config configs/sl.yaml \
    traces=$E/train_traces labels=$E/golden_train_B${B}_W${W} budget=$B interval=$W heldout=8 steps=2400 \
    eval_fidelity=false replay_batch_size=4 feature_set=[prekey,value,attn,age] pair_weight=gap dagger_rounds=4 \
    dagger_beta=0.5 feature_cache=$E/features out_dir=$SL $resume
ev() {  # fidelity of round $1's scorer on the 48 benchmark traces into $E/ev_held_prekey_r$1$2, extra args after
  local r=$1 tag=$2; shift 2
  [ -f $E/ev_held_prekey_r$r$tag/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity \
    --model smollm2-135m --traces $E/heldout_traces --policies learned --scorer $SL/rounds/round-$r/scorer \
    --budget $B --interval $W --batch-size 4 --out $E/ev_held_prekey_r$r$tag --quiet "$@"
}
rounds=${ROUNDS_DONE:-1 2 3 4}; last=${rounds##* }
for r in $rounds; do ev $r ""; done
ev $last _sample --policy-arg selection=sample --policy-arg temperature=0.003
prev=$E/ev_held_prekey  # round 0 (../quality_B64_prekey/prekey.sh)
for r in $rounds; do
  $PY benchmarks/quality/compare.py $E/ev_held_prekey_r$r/fidelity.json:learned $prev/fidelity.json:learned $G
  prev=$E/ev_held_prekey_r$r
done
$PY benchmarks/quality/compare.py $E/ev_held_prekey_r$last/fidelity.json:learned \
    benchmarks/results/quality_B64_recipe336/quality.json:dagger $G      # against the packaged (post-RoPE) recipe
$PY benchmarks/quality/compare.py $E/ev_held_prekey_r${last}_sample/fidelity.json:learned \
    benchmarks/results/quality_B64_recipe336/sampled/quality.json:dagger_sample $G
