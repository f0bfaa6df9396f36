"""foresightkv: learned KV-cache eviction for long LLM reasoning.

The public API: :func:`load_model`, :class:`BudgetedCache` (a drop-in ``past_key_values`` for ``model.generate``),
:func:`generate`, :func:`replay`, the policy registry and the cache config.
"""

from foresight.cache import BudgetedCache
from foresight.generation import GenerationResult, generate
from foresight.models import DEFAULT_MODEL, ModelLoadError, UnsupportedModelError, load_model, model_fingerprint
from foresight.policies import EvictionPolicy, make_policy, policy_names, register_policy
from foresight.runtime import ReplayResult, replay
from foresight.schedule import CacheConfig, replay_schedule

__version__ = "0.1.0"

__all__ = [
    "BudgetedCache",
    "DEFAULT_MODEL",
    "CacheConfig",
    "EvictionPolicy",
    "GenerationResult",
    "ModelLoadError",
    "ReplayResult",
    "UnsupportedModelError",
    "generate",
    "load_model",
    "make_policy",
    "model_fingerprint",
    "policy_names",
    "register_policy",
    "replay",
    "replay_schedule",
]
