#!/usr/bin/env bash
# session 31: both packaged scorers on three more traces of each of the 16 held-out problems no benchmark had used
# (the "extra16" of the README; seed 1, 3 samples each: 48 traces, never trained on), so the out-of-split share of
# the gap rests on more than one trace per problem. Golden labels at both settings, then the quality benchmark with
# tova (the best heuristic on extra16 at both budgets), h2o, and the packaged scorer top-k and sampled at the
# temperature its config records. Paired intervals: run.py's per trace, and compare.py --by-problem. Rerun to resume.
# STAGE=traces: stop after the traces.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
PY=${PY:-.venv/bin/python}; E=${E:-runs/quality}; X=$E/extra16x3_traces; R=benchmarks/results/extra16x3_s31
export OMP_NUM_THREADS=1
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
[ -f $E/split/heldout_extra16.jsonl ] || tail -16 $E/split/heldout.jsonl > $E/split/heldout_extra16.jsonl
stamp traces
two_ranks $PY -m foresight trace --model smollm2-135m --data $E/split/heldout_extra16.jsonl --samples 3 \
    --max-new-tokens 512 --batch-size 12 --seed 1 --out $X --no-progress
[ "${STAGE:-}" = traces ] && { stamp "traces done (STAGE=traces)"; exit 0; }
stamp "golden labels"
two_ranks $PY -m foresight golden --traces $X --out $E/golden_x16x3_B64_W16 --budget 64 --interval 16 --no-progress
two_ranks $PY -m foresight golden --traces $X --out $E/golden_x16x3_B128_W32 --budget 128 --interval 32 --no-progress
bench() {  # B W scorer out
  local b=$1 w=$2 s=$3 out=$4
  [ -f $out/quality.json ] || $PY benchmarks/quality/run.py --model smollm2-135m --traces $X \
    --setting $b:$w=$E/golden_x16x3_B${b}_W${w} --policies tova,h2o --scorer topk=$s --scorer sample=$s \
    --policy-arg sample.selection=sample --batch-size 4 --out $out
}
stamp benchmarks
bench 64 16 benchmarks/results/quality_B64_prekey_dagger/scorer $E/x16x3_B64 & p1=$!
bench 128 32 benchmarks/results/s50/b128_s41 $E/x16x3_B128 & p2=$!
wait $p1 && wait $p2
C="$PY benchmarks/quality/compare.py"
{ for b in "64 16" "128 32"; do set -- $b; Q=$E/x16x3_B$1/quality.json
    for s in topk sample; do $C $Q:$s $Q:tova --budget $1 --interval $2 --gap $Q:tova --by-problem; done
    $C $Q:sample $Q:h2o --budget $1 --interval $2 --by-problem
  done; } | tee $R/compare.txt
for b in 64 128; do mkdir -p $R/B$b && cp $E/x16x3_B$b/quality.{json,md,png} $R/B$b/; done
stamp done
