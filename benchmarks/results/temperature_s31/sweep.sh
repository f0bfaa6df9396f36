#!/usr/bin/env bash
# session 31: the sampling temperature of both packaged scorers, chosen on validation traces that neither training
# nor any benchmark used: the 8 problems the recipe held out inside training (`heldout_traces` in each scorer's
# config, the same 8 at both budgets), 6 traces each (seed 11, the recipe's sampling otherwise), golden labels at
# both settings, then the quality benchmark with tova, h2o, top-k and `selection=sample` at T = 0.001 ... 0.03.
# About 45 min on 2 cores (traces 4, labels 5, the two sweeps side by side 37). Rerun to resume. STAGE=traces: stop
# after the validation traces.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; V=$E/val_traces
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
mkdir -p $E/val_split
$PY - "$E" <<'PY'
import json, sys
e = sys.argv[1]
ids = {t.split("#")[0] for t in json.load(open("benchmarks/results/quality_B64_prekey_dagger/scorer/config.json"))
       ["provenance"]["heldout_traces"]}
rows = [r for r in map(json.loads, open(f"{e}/split/train.jsonl")) if r["id"] in ids]
assert len(rows) == 8, len(rows)
with open(f"{e}/val_split/val8.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
PY
stamp "validation traces"
two_ranks $PY -m foresight trace --model smollm2-135m --data $E/val_split/val8.jsonl --samples 6 \
    --max-new-tokens 512 --batch-size 12 --seed 11 --out $V --no-progress
[ "${STAGE:-}" = traces ] && { stamp "validation traces done (STAGE=traces)"; exit 0; }
stamp "golden labels"
two_ranks $PY -m foresight golden --traces $V --out $E/golden_val_B64_W16 --budget 64 --interval 16 --no-progress
two_ranks $PY -m foresight golden --traces $V --out $E/golden_val_B128_W32 --budget 128 --interval 32 --no-progress
sweep() {  # B W scorer out
  local b=$1 w=$2 s=$3 out=$4; local args=(--scorer topk=$s)
  for t in 0.001 0.002 0.003 0.005 0.01 0.03; do
    local n=t${t#0.}; args+=(--scorer $n=$s --policy-arg $n.selection=sample --policy-arg $n.temperature=$t)
  done
  [ -f $out/quality.json ] || $PY benchmarks/quality/run.py --model smollm2-135m --traces $V \
    --setting $b:$w=$E/golden_val_B${b}_W${w} --policies tova,h2o "${args[@]}" --batch-size 4 --out $out
}
stamp sweeps
sweep 64 16 benchmarks/results/quality_B64_prekey_dagger/scorer $E/tsweep_B64 & p1=$!
sweep 128 32 benchmarks/results/s50/b128_s41 $E/tsweep_B128 & p2=$!
wait $p1 && wait $p2
R=benchmarks/results/temperature_s31
for b in 64 128; do mkdir -p $R/B$b && cp $E/tsweep_B$b/quality.{json,md,png} $R/B$b/; done
C="$PY benchmarks/quality/compare.py"
{ for t in t002 t005 t01; do $C $E/tsweep_B64/quality.json:$t $E/tsweep_B64/quality.json:t003 --budget 64 --interval 16 --by-problem; done
  for t in t002 t005 t01; do $C $E/tsweep_B128/quality.json:$t $E/tsweep_B128/quality.json:t003 --budget 128 --interval 32 --by-problem; done
} | tee $R/sweep_compare.txt
stamp done
