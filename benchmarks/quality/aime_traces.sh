#!/usr/bin/env bash
# The 60 AIME 2024 + 2025 traces of SmolLM2 that the AIME checks read: $1/aime.jsonl (the two bundled
# problem sets, ids prefixed aime24-/aime25-) and $1/traces (seed 0, MAX_NEW new tokens, default 512, two ranks).
# Resumable: rerun it.
#   bash benchmarks/quality/aime_traces.sh runs/quality/aime
#   MAX_NEW=1024 bash benchmarks/quality/aime_traces.sh runs/quality/aime1024    # the 1,024-token cap
set -euo pipefail
cd "$(dirname "$0")/../.."
E=${1:?usage: aime_traces.sh OUT_DIR}; PY=${PY:-.venv/bin/python}; MAX_NEW=${MAX_NEW:-512}
export OMP_NUM_THREADS=1
mkdir -p "$E"
$PY -c "import json
with open('$E/aime.jsonl','w') as out:
    for n in ('aime24','aime25'):
        for line in open(f'foresight/problem_sets/{n}.jsonl'):
            r=json.loads(line); r['id']=f'{n}-{r[\"id\"]}'; out.write(json.dumps(r)+'\\n')"
run() { RANK=$1 WORLD_SIZE=2 $PY -m foresight trace --model smollm2-135m --data "$E/aime.jsonl" --max-new-tokens $MAX_NEW \
    --batch-size 16 --seed 0 --out "$E/traces" --no-progress; }
run 0 & p0=$!; run 1 & p1=$!; wait $p0 && wait $p1
