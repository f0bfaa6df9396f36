#!/usr/bin/env bash
# session 41, after the rules had decided (no rule here; it fills the README table's last unmeasured cells): the
# packaged scorers at their recorded top-k defaults (B=64: spread 0.005; B=128: spread 0.005 and newcomer bonus
# 0.012) on the 16 unused held-out problems, one trace each (seed 0; the "16 unused problems" column), against the
# committed plain top-k runs of the same scorers on the same traces. Outputs under $O (default runs/s41). Rerun to
# resume.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
E=runs/quality PY=.venv/bin/python O=${O:-runs/s41} R=benchmarks/results X=runs/quality/heldout_extra16_traces
F=fidelity.json:learned
[ -f $E/split/heldout.jsonl ] || { echo "spread_s41/extra16.sh: error: $E/split missing (python benchmarks/quality/split.py $E/split)" >&2; exit 2; }
[ -d $X ] || { tail -16 $E/split/heldout.jsonl > $E/split/heldout_extra16.jsonl; OMP_NUM_THREADS=2 $PY -m foresight \
    trace --model smollm2-135m --data $E/split/heldout_extra16.jsonl --max-new-tokens 512 --batch-size 16 --seed 0 --out $X --no-progress; }
ev() {  # budget interval scorer out
  [ -f $O/$4/fidelity.json ] || OMP_NUM_THREADS=1 $PY -m foresight eval fidelity --model smollm2-135m --traces $X \
    --policies learned --scorer $3 --budget $1 --interval $2 --batch-size 4 --policy-arg selection=topk --policy-arg age_prior=0 --out $O/$4 --quiet
}
ev 64 16 foresight/scorers/smollm2-135m-b64-w16 x16_64 & p1=$!
ev 128 32 benchmarks/results/s50/b128_s41 x16_128 & p2=$!; wait $p1; wait $p2
cmp() { $PY benchmarks/quality/compare.py "$@"; }
{ cmp $O/x16_64/$F $R/ensemble_s33/x16_topk/$F --budget 64 --interval 16 --gap $R/quality_B64_recipe336/extra16/quality.json:tova
  cmp $O/x16_128/$F $R/quality_B128_prekey_dagger/ev128_x16_prekey/$F --budget 128 --interval 32 \
    --gap $R/quality_B128_recipe336/extra16/quality.json:tova
} | tee $O/extra16_compare.txt
