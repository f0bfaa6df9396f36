#!/usr/bin/env bash
# The decode-throughput table on one GPU (about 8 minutes on an H200): foresight full/h2o/learned, model.generate with a
# BudgetedCache, with its dynamic cache and with its static cache compiled, on random-weight models of SmolLM2-135M's
# and Qwen3-4B's shapes. `bash benchmarks/gpu/run.sh --dry-run` checks it on the CPU with a tiny model.
# The compiled columns (foresight h2o/learned on the static cache, CUDA graphs) compile once per row; if the run
# would not fit, `--sides` keeps only some columns.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
exec timeout 480 "$PY" benchmarks/gpu/bench_decode.py "$@"
