"""Plugins: what packages above the library add to its registries, declared as entry points, loaded on first use.

The library defines two registries that packages above it extend without the library importing them (arrows
point down only):

* ``foresight.commands``: ``NAME = "package.module:register"``, a function ``register(subparsers)`` that adds the
  ``foresight NAME`` subcommand (:mod:`foresight.cli`);
* ``foresight.policies``: ``NAME = "package.module:PolicyClass"``, an :class:`~foresight.policies.EvictionPolicy`
  registered under ``NAME`` (:mod:`foresight.policies.registry`).

A package declares them in its ``pyproject.toml`` (``[project.entry-points."foresight.policies"]``); foresightkv's
own ``golden``, ``evaluation`` and ``training`` packages do so for their commands and the ``golden`` policy. Names
are known from the installed metadata without importing anything (``foresight --help`` stays fast); the object
is imported when it is first needed. A plugin that fails to import is one line naming it, its distribution and
the import error (:class:`PluginError`).
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points

from foresight.errors import ForesightError

COMMANDS = "foresight.commands"
POLICIES = "foresight.policies"


class PluginError(ForesightError):
    """A registered plugin (command or policy) that cannot be loaded: a broken or partial installation."""


@lru_cache(maxsize=None)
def plugins(group: str) -> dict[str, EntryPoint]:
    """``{name: entry point}`` of ``group`` from the installed distributions' metadata (nothing is imported). A name
    declared twice, by two distributions, is refused: which one wins would depend on the order of ``sys.path``."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        if ep.name in found and found[ep.name].value != ep.value:
            raise PluginError(f"{group} {ep.name!r} is declared twice ({_where(found[ep.name])} and {_where(ep)}); "
                              "uninstall one of the two distributions")
        found[ep.name] = ep
    return found


def load(ep: EntryPoint, group: str):
    """The object ``ep`` names, imported; any failure to import it is a :class:`PluginError` in one line."""
    try:
        return ep.load()
    except Exception as exc:  # ImportError, or any error raised while the plugin's module runs
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise PluginError(f"{group} {ep.name!r} ({_where(ep)}) failed to import: {type(exc).__name__}: {detail}; "
                          "reinstall the distribution that provides it") from exc


def _where(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value} from {dist.name} {dist.version}" if dist is not None else ep.value


__all__ = ["COMMANDS", "POLICIES", "PluginError", "load", "plugins"]
