"""Shared fixtures: tiny random models (cached per session) and the default model for slow tests."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TINY = ["tiny-llama", "tiny-qwen3"]
_CACHE: dict[str, tuple] = {}


def get_model(name: str):
    """Load (once per test session) a model by name; tests must not mutate it."""
    if name not in _CACHE:
        import foresight

        _CACHE[name] = foresight.load_model(name, device="cpu")
    return _CACHE[name]


@pytest.fixture(params=TINY)
def tiny(request):
    return get_model(request.param)


@pytest.fixture
def tiny_llama():
    return get_model("tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    return get_model("smollm2-135m")
