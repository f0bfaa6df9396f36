#!/usr/bin/env bash
# session 46: traces as long as the model writes them.
# Every trace the scorers were trained or measured on was cut at 512 new tokens, while `foresight trace` defaults to
# 1,024 and SmolLM2 writes up to ~800: 63 of the 336 training traces and 13 of the 48 validation traces hit that cap,
# and the scorer loses most of its share on long traces (benchmarks/quality/by_length.py, docs/results.md).
#
# 1. (measurement, no decision) the 48 validation traces again at a 1,024-token cap (the same 8 problems held out
#    inside training, 6 samples, seed 11; every trace has its own seeded generator), golden labels at B=64/W=16, and
#    the quality benchmark on them: tova, h2o, golden, the recipe's round 3 (the member packaged in sessions 26-32,
#    benchmarks/results/quality_B64_prekey_dagger/scorer) top-k and sampled at T=0.005, and the packaged avg3 at its
#    defaults. How the scorers do where traces run past anything they trained on.
# 2. (the lever) a second sample (--first-sample 1, seed 0) of each of the 63 training problems whose first trace
#    hit the cap, at a 1,024-token cap; golden labels; the recipe (benchmarks/quality/train_sl.sh: SL + three DAgger
#    rounds at beta 0.5, pre-RoPE features, seed 0) on the 336 + 63 traces (the same distinct problems, so the same
#    8 stay held out). It adds data (+19% traces) as well as length; session 35-36's twice the data was level.
# Decision rule, fixed before any number: the long traces help only if round 3 sampled at T=0.005 is lower than the
# recipe's round 3 at T=0.005 on the 1,024-cap validation traces with the paired (by problem) interval below zero,
# and on the 512-cap validation traces (temperature_s31's reference) its paired point is not above zero. Top-k is
# printed beside both, no decision rides on it. Only then would the packaged members be retrained this way.
# About 2.5 h on 2 cores (traces 35 min, labels 5, recipe ~85 with the step-1 benchmark beside it, evaluations 20).
# Every stage resumes when rerun. STAGE=measure stops after step 1.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s46}; R=benchmarks/results/long_s46
V=$E/val1024_traces LV=$E/golden_val1024_B64_W16 T=$E/train_long1024 LT=$E/golden_train_long1024_B64_W16
SL=$O/long S31=benchmarks/results/temperature_s31/B64/quality.json
R3=benchmarks/results/quality_B64_prekey_dagger/scorer
export OMP_NUM_THREADS=1
for f in $E/split/train.jsonl $E/val_split/val8.jsonl $E/train_traces/plan.json $E/golden_train_B64_W16/plan.json \
         $E/val_traces/plan.json $S31 $R3/config.json; do
  [ -f $f ] || { echo "long_s46/run.sh: error: $f missing (run runs/s45/data.sh's stages first)" >&2; exit 2; }
done
mkdir -p $O
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
stamp "validation traces at a 1,024-token cap"
two_ranks $PY -m foresight trace --model smollm2-135m --data $E/val_split/val8.jsonl --samples 6 \
    --max-new-tokens 1024 --batch-size 12 --seed 11 --out $V --no-progress
stamp "the training problems whose trace hit the cap"
[ -f $E/split/train_capped.jsonl ] || $PY - "$E" <<'PY'
import json, sys
from golden.traces import load_traces
e = sys.argv[1]
capped = {r["problem_id"] for r in load_traces(f"{e}/train_traces") if not r["finished"]}
rows = [r for r in map(json.loads, open(f"{e}/split/train.jsonl")) if r["id"] in capped]
assert len(rows) == len(capped) == 63, (len(rows), len(capped))
with open(f"{e}/split/train_capped.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
PY
two_ranks $PY -m foresight trace --model smollm2-135m --data $E/split/train_capped.jsonl --first-sample 1 \
    --max-new-tokens 1024 --batch-size 16 --seed 0 --out $T --no-progress
stamp "golden labels B=64 W=16"
two_ranks $PY -m foresight golden --traces $V --out $LV --budget 64 --interval 16 --no-progress
two_ranks $PY -m foresight golden --traces $T --out $LT --budget 64 --interval 16 --no-progress
measure() {
  [ -f $O/val1024/quality.json ] || $PY benchmarks/quality/run.py --model smollm2-135m --traces $V \
    --setting 64:16=$LV --policies tova,h2o --scorer r3_topk=$R3 --scorer r3_t005=$R3 \
    --scorer avg3=smollm2-135m-b64-w16 --policy-arg avg3.selection=sample --policy-arg r3_topk.selection=topk \
    --policy-arg r3_t005.selection=sample --policy-arg r3_t005.temperature=0.005 --batch-size 4 --out $O/val1024
}
if [ "${STAGE:-}" = measure ]; then stamp "benchmark on the 1,024-cap traces"; measure; stamp "done (STAGE=measure)"; exit 0; fi
stamp "the recipe on 336 + 63 traces, the step-1 benchmark beside it"
measure > $O/measure.log 2>&1 & pm=$!
[ -f $SL/scorer/config.json ] || PY=$PY PORT=29846 bash benchmarks/quality/train_sl.sh 64 16 $SL \
    "traces=[$E/train_traces,$T]" "labels=[$E/golden_train_B64_W16,$LT]"
wait $pm
stamp evaluations
ev() { PY=$PY bash benchmarks/quality/eval_learned.sh $SL/scorer "$@"; }
ev $V $O/v1024_t005 64 16 --policy-arg selection=sample --policy-arg temperature=0.005 & p1=$!
ev $V $O/v1024_topk 64 16 --policy-arg selection=topk & p2=$!; wait $p1; wait $p2
ev $E/val_traces $O/v512_t005 64 16 --policy-arg selection=sample --policy-arg temperature=0.005 & p1=$!
ev $E/val_traces $O/v512_topk 64 16 --policy-arg selection=topk & p2=$!; wait $p1; wait $p2
Q=$O/val1024/quality.json F=fidelity.json:learned
C() { $PY benchmarks/quality/compare.py "$@" --budget 64 --interval 16 --by-problem; }
mkdir -p $R
{ echo "# 1,024-cap validation: long round 3 at t005 - recipe round 3 at t005 (the rule)"
  C $O/v1024_t005/$F $Q:r3_t005 --gap $Q:tova
  echo "# 1,024-cap validation: long round 3 top-k - recipe round 3 top-k"
  C $O/v1024_topk/$F $Q:r3_topk --gap $Q:tova
  echo "# 512-cap validation: long round 3 at t005 - recipe round 3 at t005 (the rule: point not above zero)"
  C $O/v512_t005/$F $S31:t005 --gap $S31:tova
  echo "# 512-cap validation: long round 3 top-k - recipe round 3 top-k"
  C $O/v512_topk/$F $S31:topk --gap $S31:tova
  echo "# 1,024-cap validation: long round 3 at t005 - packaged avg3 at its default"
  C $O/v1024_t005/$F $Q:avg3 --gap $Q:tova
} | tee $R/validation_compare.txt
cp $O/val1024/quality.{json,md,png} $R/ 2>/dev/null || true
cp $SL/metrics.jsonl $R/metrics.jsonl
stamp done
