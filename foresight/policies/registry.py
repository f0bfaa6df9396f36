"""Registry of eviction policies by name (``foresight policies`` lists it)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

POLICIES: dict[str, type] = {}


def register_policy(cls: type) -> type:
    """Class decorator: register an :class:`EvictionPolicy` subclass under ``cls.name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    if cls.name in POLICIES and POLICIES[cls.name] is not cls:
        raise ValueError(f"policy name {cls.name!r} registered twice")
    POLICIES[cls.name] = cls
    return cls


class UnknownPolicyError(ValueError):
    pass


def policy_names() -> list[str]:
    return sorted(POLICIES)


def make_policy(name: str, **kwargs: Any):
    """Instantiate a policy by name with hyperparameters; ``wrapper:inner`` names wrap another policy.

    Unknown hyperparameters and unknown names raise ``ValueError`` with the valid choices.
    """
    if ":" in name:
        outer, inner = name.split(":", 1)
        if outer not in POLICIES:
            raise UnknownPolicyError(f"unknown policy {outer!r}; choose from {', '.join(policy_names())}")
        inner_kwargs = kwargs.pop("inner_kwargs", {}) or {}
        return _build(outer, {**kwargs, "inner": make_policy(inner, **inner_kwargs)})
    if name not in POLICIES:
        raise UnknownPolicyError(f"unknown policy {name!r}; choose from {', '.join(policy_names())}")
    return _build(name, kwargs)


def _build(name: str, kwargs: dict):
    cls = POLICIES[name]
    valid = {f.name for f in fields(cls) if f.init}
    bad = sorted(set(kwargs) - valid)
    if bad:
        raise ValueError(
            f"policy {name!r} has no hyperparameter(s) {', '.join(bad)}; "
            f"it takes: {', '.join(sorted(valid)) or 'none'}"
        )
    return cls(**kwargs)
