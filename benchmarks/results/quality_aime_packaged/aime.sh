#!/usr/bin/env bash
# session 29: both packaged scorers (smollm2-135m-b64-w16 since session 26, smollm2-135m-b128-w32 since session 28)
# on the 60 AIME 2024 + 2025 traces of SmolLM2 (no AIME problem is in any training split). Resumable: rerun it.
# B=64/W=16: learned-only fidelity, paired per trace against session 21's run of the then packaged scorer on the same
# traces (../quality_B64_aime/quality.json; compare.py refuses other tokens or full-cache CE), gap = tova -> golden
# of that run. B=128/W=32 was never measured on AIME: golden labels, the heuristics that lead on the benchmark split
# at B=128 (tova, h2o, snapkv, rkv; lazy as the mission's first baseline; streaming_llm, keydiff, random and paged
# are far behind there) and three learned stages: the packaged scorer top-k and sampled, and session 12's scorer
# (../quality_B128_recipe336/scorer) top-k.
set -euo pipefail
cd "$(dirname "$0")/../../.."; E=${E:-runs/quality/aime}; PY=${PY:-.venv/bin/python}
R=benchmarks/results/quality_aime_packaged; A=benchmarks/results/quality_B64_aime
stamp() { echo "== $(date -u +%FT%TZ) $*"; }
two_ranks() { RANK=0 WORLD_SIZE=2 "$@" & local p0=$!; RANK=1 WORLD_SIZE=2 "$@" & local p1=$!; wait $p0 && wait $p1; }
export OMP_NUM_THREADS=1
stamp traces
bash benchmarks/quality/aime_traces.sh $E
ev() {  # ev OUT SCORER B W [extra args]: learned-only fidelity
  local out=$1 scorer=$2 b=$3 w=$4; shift 4
  [ -f $out/fidelity.json ] || OMP_NUM_THREADS=2 $PY -m foresight eval fidelity --model smollm2-135m --traces $E/traces \
    --policies learned --scorer $scorer --budget $b --interval $w --batch-size 4 --out $out --quiet "$@"
}
S="--policy-arg selection=sample --policy-arg temperature=0.003"
stamp B64 learned
ev $E/ev64 benchmarks/results/quality_B64_prekey_dagger/scorer 64 16
ev $E/ev64_sample benchmarks/results/quality_B64_prekey_dagger/scorer 64 16 $S
C="$PY benchmarks/quality/compare.py"; L=fidelity.json:learned
G="--budget 64 --interval 16 --gap $A/quality.json:tova"
$C $E/ev64/$L $A/quality.json:packaged $G | tee $R/compare_B64_topk.txt
$C $E/ev64_sample/$L $A/quality.json:packaged_sample $G | tee $R/compare_B64_sample.txt
stamp golden B128
two_ranks $PY -m foresight golden --traces $E/traces --out $E/golden_B128_W32 --budget 128 --interval 32 --no-progress
stamp B128 benchmark
OMP_NUM_THREADS=2 $PY benchmarks/quality/run.py --model smollm2-135m --traces $E/traces \
    --setting 128:32=$E/golden_B128_W32 --scorer session12=benchmarks/results/quality_B128_recipe336/scorer \
    --scorer packaged=benchmarks/results/s50/b128_s41 --scorer packaged_sample=benchmarks/results/s50/b128_s41 \
    --policy-arg packaged_sample.selection=sample --policy-arg packaged_sample.temperature=0.003 \
    --policies tova,h2o,snapkv,rkv,lazy --out $E/quality_B128
cp $E/quality_B128/quality.{json,md,png} $R/ 2>/dev/null || cp $E/quality_B128/quality.* $R/
stamp done
