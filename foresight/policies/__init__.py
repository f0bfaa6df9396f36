"""Eviction policies, one module each, registered by name."""

from foresight.policies.base import EntryState, EvictionPolicy
from foresight.policies.registry import POLICIES, UnknownPolicyError, make_policy, policy_names, register_policy

# Importing a policy module registers it.
from foresight.policies import full, random, streaming_llm  # noqa: E402,F401  isort: skip

__all__ = [
    "POLICIES",
    "EntryState",
    "EvictionPolicy",
    "UnknownPolicyError",
    "make_policy",
    "policy_names",
    "register_policy",
]
