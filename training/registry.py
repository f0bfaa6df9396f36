"""Registry of trainers for ``foresight train <name>`` (SL distillation, GRPO, ...).

A trainer module in :mod:`training` registers itself with :func:`register_trainer`; the ``train`` command
imports every module of the package, so adding a trainer needs no edit elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

import training

TRAINERS: dict[str, "TrainerSpec"] = {}


@dataclass(frozen=True)
class TrainerSpec:
    """``config_cls`` is a validated dataclass with ``from_dict``; ``run(config, resume, overwrite=...)`` returns a
    summary."""

    name: str
    config_cls: type
    run: Callable[..., dict]
    help: str = ""


def register_trainer(name: str, config_cls: type, help: str = ""):
    """Decorator registering ``run(config, resume=False, overwrite=False) -> dict`` as trainer ``name``."""

    def deco(fn):
        if name in TRAINERS and TRAINERS[name].run is not fn:
            raise ValueError(f"trainer {name!r} registered twice")
        TRAINERS[name] = TrainerSpec(name, config_cls, fn, help)
        return fn

    return deco


def load_trainers() -> dict[str, TrainerSpec]:
    """Import every module of :mod:`training` (they register themselves) and return the registry."""
    for mod in pkgutil.iter_modules(training.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"training.{mod.name}")
    return TRAINERS
