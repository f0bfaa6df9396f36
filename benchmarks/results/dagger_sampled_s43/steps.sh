#!/usr/bin/env bash
# session 43, second question: are the later DAgger rounds under-trained?
#
# Every round of the recipe trains `steps` = 2,400 steps of 8 events (micro_batch 4 x 2 ranks), whatever its data:
# round 0 sees its 7,516 golden events 2.6 times, round 3 its 30,064 aggregated events 0.64 times. If the rounds'
# final fits are short of what their rows can teach, more steps on the *same* rows lower the loss ratio.
#
# Diagnostic (not a recipe): run.sh's finished run (sampled rounds, seed 0) is copied with its rows hard-linked;
# round 3 is dropped (scorer, checkpoints, summary; its recorded rows kept) and retrained from the same aggregated
# rows (golden + rounds 1-3) with 4 x 2,400 = 9,600 steps, the same number of passes over its events as round 0's.
# The copy's rounds/dagger.json records steps=9600 so that `--resume` accepts the run; rounds 0-2 in the copy were
# trained with 2,400 steps (their own summary.json files say so). The only difference from run.sh's round 3 is the
# step count (and the cosine schedule it spans): same rows, seed, learning rate.
# Rule, fixed before any number: later rounds are under-trained if the 9,600-step round 3 is lower than run.sh's round
# 3 on the 48 validation traces at both selections (sampled T=0.005 and plain top-k), with at least one paired interval
# (by problem) below zero. If so, the next step is a recipe that scales each round's steps with its events, run
# from scratch against the recipe's own; if not, 2,400 steps stay.
# Needs run.sh's finished run under $O (default runs/s43). Rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s43} R=benchmarks/results/dagger_sampled_s43
SRC=$O/dagger_t005 DST=$O/dagger_t005_steps4x
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
if [ ! -f $DST/rounds/dagger.json ]; then
  stamp "copy (rows hard-linked), round 3 dropped, steps=9600 recorded"
  rm -rf $DST.tmp && mkdir -p $DST.tmp/rounds/round-3
  for r in 0 1 2; do cp -al $SRC/rounds/round-$r $DST.tmp/rounds/; done
  cp -al $SRC/rounds/round-3/rows $DST.tmp/rounds/round-3/
  cp $SRC/split.json $DST.tmp/
  $PY - $SRC/rounds/dagger.json $DST.tmp/rounds/dagger.json <<'PYEOF'
import json, sys
state = json.load(open(sys.argv[1]))
assert state["settings"]["steps"] == 2400, state["settings"]["steps"]
state["settings"]["steps"] = 9600
state["note"] = "steps.sh (session 43): rounds 0-2 copied from a 2,400-step run; round 3 retrained with 9,600 steps"
json.dump(state, open(sys.argv[2], "w"), indent=1)
PYEOF
  mv $DST.tmp $DST
fi
stamp "round 3 with 9,600 steps on the same rows"
[ -f $DST/rounds/round-3/scorer/config.json ] || E=$E PY=$PY bash benchmarks/quality/train_sl.sh 64 16 $DST \
    dagger_temperature=0.005 steps=9600
ev() {  # out [extra args]
  local out=$1; shift
  PY=$PY bash benchmarks/quality/eval_learned.sh $DST/rounds/round-3/scorer $E/val_traces $O/$out 64 16 "$@"
}
stamp "validation"
ev v_r3s4_topk --policy-arg selection=topk & p1=$!
ev v_r3s4_t005 --policy-arg selection=sample --policy-arg temperature=0.005 & p2=$!
wait $p1; wait $p2
F=fidelity.json:learned G=benchmarks/results/temperature_s31/B64/quality.json:tova
{ $PY benchmarks/quality/compare.py $O/v_r3s4_t005/$F $O/v_r3_t005/$F --budget 64 --interval 16 --by-problem --gap $G
  $PY benchmarks/quality/compare.py $O/v_r3s4_topk/$F $O/v_r3_topk/$F --budget 64 --interval 16 --by-problem --gap $G
} | tee $R/steps_compare.txt
cp $DST/metrics.jsonl $R/metrics_dagger_t005_steps4x.jsonl
stamp done
