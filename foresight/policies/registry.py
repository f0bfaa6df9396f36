"""Registry of eviction policies by name (``foresight policies`` lists it)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from foresight.config import ConfigError, check_kwargs
from foresight.errors import ForesightError

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


#: Policies registered by packages above the library, and the import that registers them.
REGISTERED_ELSEWHERE = {"golden": "golden"}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def _unknown(name: str, what: str = "") -> UnknownPolicyError:
    hint = f" (`import {REGISTERED_ELSEWHERE[name]}` registers it)" if name in REGISTERED_ELSEWHERE else ""
    return UnknownPolicyError(f"{what}unknown policy {name!r}{hint}; choose from {', '.join(policy_names())}")


def check_policy_names(names, what: str = "policies") -> list[str]:
    """``names`` (a list, or a comma-separated string) as a list of registered names, each listed once;
    ``wrapper:inner`` checks both parts. Raises :class:`UnknownPolicyError` naming ``what`` and the bad name."""
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    if not all(isinstance(n, str) and n for n in items):
        raise ConfigError(f"{what} must be a list of policy names, got {names!r}")
    for name in items:
        for part in name.split(":"):
            if part not in POLICIES:
                raise _unknown(part, f"{what}: ")
    if len(set(items)) != len(items):
        raise ConfigError(f"{what}: a policy is listed twice in {names!r}")
    return items


def make_policy(name: str, **kwargs: Any):
    """Instantiate a policy by name with hyperparameters; ``wrapper:inner`` names wrap another policy.

    Unknown hyperparameters and unknown names raise ``ValueError`` with the valid choices.
    """
    if ":" in name:
        outer, inner = name.split(":", 1)
        if outer not in POLICIES:
            raise _unknown(outer)
        if kwargs.get("inner", inner) != inner:  # it replaced `inner` silently: caote:h2o with inner=tova ran h2o
            raise ValueError(f"policy {name!r} names its inner policy ({inner!r}); drop the hyperparameter "
                             f"inner={kwargs['inner']!r}, or give the wrapper alone: {outer!r} with inner=...")
        kwargs.pop("inner", None)  # the same name (configs/policies/caote.yaml's inner: h2o with caote:h2o)
        inner_kwargs = kwargs.pop("inner_kwargs", {}) or {}
        return _build(outer, {**kwargs, "inner": make_policy(inner, **inner_kwargs)})
    if name not in POLICIES:
        raise _unknown(name)
    return _build(name, kwargs)


def checked_policy(name: str, caches, what: str, **kwargs: Any):
    """:func:`make_policy` checked to take every ``(budget, interval)`` of ``caches`` (e.g. ``paged`` needs W a
    multiple of its block), for commands that check their arguments before loading a model: an unknown name, a bad
    hyperparameter or a cache the policy cannot run is one :class:`ForesightError` that starts with ``what``."""
    try:
        policy = make_policy(name, **kwargs)
        for budget, interval in caches:
            policy.check_cache(budget, interval)
    except (TypeError, ValueError) as exc:
        raise ForesightError(f"{what}: {exc}") from None
    return policy


def _build(name: str, kwargs: dict):
    cls = POLICIES[name]
    valid = {f.name for f in fields(cls) if f.init}
    bad = sorted(set(kwargs) - valid)
    if bad:
        raise ValueError(
            f"policy {name!r} has no hyperparameter(s) {', '.join(bad)}; "
            f"it takes: {', '.join(sorted(valid)) or 'none'}"
        )
    return cls(**check_kwargs(cls, kwargs, f"policy {name!r} hyperparameter"))
