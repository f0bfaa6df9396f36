#!/usr/bin/env bash
# session 52: the scaling curve at today's recipe (a measurement; nothing is chosen on it). The README's curve is
# session 5's (11 / 36 / 120 traces, post-RoPE keys, 600 steps); this one is SL round 0 of the recipe as
# benchmarks/results/quality_B64_prekey/prekey.sh trained it on all 328 training traces (B=64/W=16, pre-RoPE keys,
# gap-weighted pairs, 2,400 steps, seed 0, heldout=8), on nested random subsets of 12, 48 and 192 of those traces
# (problems drawn with a fixed seed; the same 8 held-out problems, so the same in-split validation), then plain
# top-k on the 48 benchmark traces in one quality run beside tova and golden (the 328 point is prekey.sh's
# committed scorer). Features come from the recipe's cache (the same traces, nothing extracted again).
# About 45 min on 2 cores alone; every stage resumes when rerun.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; O=${O:-runs/s52/scaling}; R=benchmarks/results/s52/scaling
ALL=benchmarks/results/quality_B64_prekey/sl0_prekey_scorer
for f in $E/train_traces/plan.json $E/heldout_traces/plan.json $E/golden_train_B64_W16/plan.json $ALL/config.json; do
  [ -f $f ] || { echo "s52/scaling.sh: error: $f missing (run benchmarks/quality/recipe.sh's stages first)" >&2
                 exit 2; }
done
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
mkdir -p $O $R
stamp "subsets"
[ -d $O/traces_192 ] || $PY - $E/train_traces $O <<'PY'
import random, sys
from golden.traces import load_traces
from training.provenance import split_problems
src, out = sys.argv[1:]
ds = load_traces(src)
ids = list(ds["problem_id"])
held = split_problems(ids, 8, 0)   # the recipe's held-out problems (heldout=8, split_seed=0)
train = sorted(set(ids) - held)
assert len(train) == 328 and len(ids) == len(set(ids)) == 336, (len(train), len(ids))
order = random.Random(52).sample(train, len(train))   # nested: the first 12 of the 48, the first 48 of the 192
for n in (12, 48, 192):
    keep = held | set(order[:n])   # the 8 held-out problems still sort last by split_problems' hash: held out
    sub = ds.filter(lambda r: r["problem_id"] in keep)
    assert split_problems(list(sub["problem_id"]), 8, 0) == held and len(sub) == n + 8
    sub.save_to_disk(f"{out}/traces_{n}")
PY
for n in 12 48 192; do
  stamp "SL round 0 on $n traces"
  [ -f $O/sl_$n/scorer/config.json ] || PY=$PY PORT=29852 bash benchmarks/quality/train_sl.sh 64 16 $O/sl_$n \
      traces=$O/traces_$n dagger_rounds=0
done
stamp "golden labels of the benchmark traces (B=64/W=16)"
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
two_ranks $PY -m foresight golden --traces $E/heldout_traces --out $O/golden_B64_W16 --budget 64 --interval 16 \
    --no-progress
stamp "the quality run"
$PY benchmarks/quality/run.py --model smollm2-135m --traces $E/heldout_traces --setting 64:16=$O/golden_B64_W16 \
    --policies tova --scorer sl_12=$O/sl_12/scorer --scorer sl_48=$O/sl_48/scorer --scorer sl_192=$O/sl_192/scorer \
    --scorer sl_328=$ALL --batch-size 4 --out $O/quality
cp $O/quality/quality.{json,md,png} $R/
for n in 12 48 192; do cp $O/sl_$n/metrics.jsonl $R/metrics_sl_$n.jsonl; done
$PY benchmarks/quality/scaling.py $R/quality.json --out $R/scaling.png | tee $R/scaling.txt
# the 328 point is the committed scorer's run of sessions 22-23 again (same traces, same scorer)
$PY benchmarks/quality/compare.py $R/quality.json:sl_328 \
    benchmarks/results/quality_B64_prekey/ev_held_prekey/fidelity.json:learned --budget 64 --interval 16 \
    | tee -a $R/scaling.txt
stamp done
