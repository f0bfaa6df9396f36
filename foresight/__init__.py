"""foresightkv: learned KV-cache eviction for long LLM reasoning.

The public API: :func:`load_model`, :class:`BudgetedCache` (a drop-in ``past_key_values`` for ``model.generate``),
:func:`generate`, :func:`replay`, the policy registry and the cache config.

Each name is imported on first access (PEP 562), so ``import foresight`` and the command line's argument parsing
load neither torch nor transformers; ``from foresight import BudgetedCache`` works as usual.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "BudgetedCache": "foresight.cache",
    "GenerationResult": "foresight.generation",
    "generate": "foresight.generation",
    "DEFAULT_MODEL": "foresight.models",
    "ModelLoadError": "foresight.models",
    "UnsupportedModelError": "foresight.models",
    "load_model": "foresight.models",
    "model_fingerprint": "foresight.models",
    "EvictionPolicy": "foresight.policies",
    "make_policy": "foresight.policies",
    "policy_names": "foresight.policies",
    "register_policy": "foresight.policies",
    "ReplayResult": "foresight.runtime",
    "replay": "foresight.runtime",
    "StaticBudgetedCache": "foresight.static_cache",
    "StaticConfig": "foresight.static_step",
    "CacheConfig": "foresight.schedule",
    "replay_schedule": "foresight.schedule",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later accesses skip this function
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # `foresight.models.cache_dir` after `import foresight`
    raise AttributeError(f"module 'foresight' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
