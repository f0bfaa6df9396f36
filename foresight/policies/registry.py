"""Registry of eviction policies by name (``foresight policies`` lists it).

The library's own policies register themselves with :func:`register_policy` when :mod:`foresight.policies` is
imported; packages above the library add theirs as ``foresight.policies`` entry points (:mod:`foresight.plugins`;
``golden`` is one), which :data:`POLICIES` lists by name and imports on first lookup.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

from foresight import plugins
from foresight.config import ConfigError, check_kwargs
from foresight.errors import ForesightError


class PolicyRegistry(Mapping):
    """``{name: policy class}``: the registered classes and the plugins' names; a plugin is imported (and
    registered) when it is first looked up, so listing names imports nothing."""

    def __init__(self):
        self._classes: dict[str, type] = {}

    def add(self, cls: type) -> None:
        if not cls.name:
            raise TypeError(f"{cls.__name__} has no name")
        if self._classes.get(cls.name, cls) is not cls:
            raise ValueError(f"policy name {cls.name!r} registered twice")
        self._classes[cls.name] = cls

    def __getitem__(self, name: str) -> type:
        if name not in self._classes:
            ep = plugins.plugins(plugins.POLICIES).get(name)
            if ep is None:
                raise KeyError(name)
            cls = plugins.load(ep, plugins.POLICIES)
            if getattr(cls, "name", None) != name:
                raise plugins.PluginError(f"{plugins.POLICIES} {name!r} ({ep.value}) is not a policy class named "
                                          f"{name!r}")
            self.add(cls)
        return self._classes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._classes or name in plugins.plugins(plugins.POLICIES)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._classes) | set(plugins.plugins(plugins.POLICIES))))

    def __len__(self) -> int:
        return len(set(self._classes) | set(plugins.plugins(plugins.POLICIES)))


POLICIES = PolicyRegistry()


def register_policy(cls: type) -> type:
    """Class decorator: register an :class:`EvictionPolicy` subclass under ``cls.name``."""
    POLICIES.add(cls)
    return cls


class UnknownPolicyError(ValueError):
    pass


def policy_names() -> list[str]:
    return list(POLICIES)


def _unknown(name: str, what: str = "") -> UnknownPolicyError:
    return UnknownPolicyError(f"{what}unknown policy {name!r}; choose from {', '.join(policy_names())}")


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
