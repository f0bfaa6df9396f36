"""Registry of trainers for ``foresight train <name>`` (SL distillation, GRPO, LoRA adaptation, loss-aware e2e).

One row per trainer: its name, its one-line help and where its ``run`` function and config dataclass live. The
``train`` command builds its parser from the names and help alone, so ``foresight --help`` imports no trainer
(they load torch, transformers and DeepSpeed); the trainer's modules are imported when it runs. A new trainer is a
module with ``run(config, resume=False) -> dict`` and a validated config dataclass, and one row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class TrainerSpec:
    """``config`` names a validated dataclass with ``from_dict``; ``runner`` names ``run(config, resume, overwrite=False)``, which
    returns a summary (both as ``"module:attribute"``, imported on use)."""

    name: str
    help: str
    runner: str
    config: str

    @property
    def config_cls(self) -> type:
        return _attribute(self.config)

    @property
    def run(self) -> Callable[..., dict]:
        return _attribute(self.runner)


def _attribute(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


TRAINERS: dict[str, TrainerSpec] = {spec.name: spec for spec in (
    TrainerSpec("sl", "distil golden labels into the scorer (pairwise ranking hinge)",
                "training.sl:run_sl", "training.sl_config:SLConfig"),
    TrainerSpec("grpo", "refine an SL scorer with GRPO on sampled eviction sets",
                "training.grpo:run_grpo", "training.grpo_config:GRPOConfig"),
    TrainerSpec("adapt", "train a LoRA adapter so the model under eviction matches its full cache",
                "training.adapt:run_adapt", "training.adapt_config:AdaptConfig"),
    TrainerSpec("e2e", "train the scorer on the LM's loss through a relaxed (soft top-k) budgeted replay",
                "training.e2e:run_e2e", "training.e2e_config:E2EConfig"),
)}
