"""Eviction policies, one module each, registered by name.

Every module in this package is imported on first use, so a new policy file registers itself with
:func:`register_policy`; no list to edit here.
"""

import importlib
import pkgutil

from foresight.policies.base import EntryState, EvictionPolicy
from foresight.policies.registry import (POLICIES, UnknownPolicyError, checked_policy, make_policy, policy_names,
                                        register_policy)

_INFRA = {"base", "registry"}
for _mod in pkgutil.iter_modules(__path__):
    if _mod.name not in _INFRA and not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = [
    "POLICIES",
    "EntryState",
    "EvictionPolicy",
    "UnknownPolicyError",
    "checked_policy",
    "make_policy",
    "policy_names",
    "register_policy",
]
