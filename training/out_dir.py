"""A training run's ``out_dir``: whose it is, and whether a run may start there (docs/reliability.md).

* :func:`train_output`: the directory's :class:`~foresight.outputs.OutputKind` (``train sl``, ``train grpo``,
  ``train adapt``), so a trainer writes only into a new directory or its own earlier output;
* :func:`refuse_fresh` / :func:`check_claim`: a run without ``--resume`` or ``--overwrite`` refuses an earlier run,
  finished or not, with checkpoints or without;
* :func:`make_out_dir`: the directory made (or, with ``overwrite``, an earlier run of the same trainer replaced, its
  feature cache kept) and marked, on rank 0, once the task is built and before the run writes anything else.

:func:`training.loop.check_out_dir` adds the checks of a ``--resume`` (the checkpoint, its settings and files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from foresight.errors import ForesightError
from foresight.outputs import OutputKind, check_output, prepare_output_dir
from training import checkpoint as ckpt
from training.distributed import DistInfo, barrier
from training.registry import TRAINERS
from training.trainer_config import TrainerConfig

#: The default feature cache (SL, DAgger), keyed by what its features were extracted from: an overwrite keeps it.
FEATURES = "features"
#: What a training run writes in ``out_dir`` (DAgger's ``rounds/``, wandb's ``wandb/`` included).
TRAIN_ENTRIES = (ckpt.CHECKPOINTS, "scorer", "adapter", "metrics.jsonl", "summary.json", "split.json", FEATURES,
                 "rounds", "wandb")
#: What a finished run leaves (whether or not it kept checkpoints).
FINISHED_ENTRIES = ("scorer", "adapter", "summary.json")


def train_output(cfg: TrainerConfig) -> OutputKind:
    """The :class:`~foresight.outputs.OutputKind` of ``cfg``'s trainer (``train sl`` ...; by its registered config)."""
    name = next((n for n, spec in TRAINERS.items() if type(cfg) is spec.config_cls), "run")
    return OutputKind(f"train {name}", TRAIN_ENTRIES, tuple((entry,) for entry in TRAIN_ENTRIES),
                      caches=(FEATURES,))


def refuse_fresh(out_dir: str | Path) -> None:
    """A run without ``--resume`` or ``--overwrite`` refuses an ``out_dir`` that holds an earlier run: its checkpoints
    (:func:`training.checkpoint.refuse_fresh`), or what a finished run leaves (its scorer or adapter, its summary),
    kept checkpoints or not; it would silently replace them."""
    ckpt.refuse_fresh(out_dir)
    found = [name for name in FINISHED_ENTRIES if (Path(out_dir) / name).exists()]
    if found:
        raise ForesightError(f"out_dir {out_dir} holds an earlier run ({', '.join(found)}); pass --resume to continue "
                             "it, --overwrite to replace it, or choose another out_dir")


def check_claim(cfg: TrainerConfig, resume: bool, overwrite: bool,
                refuse: Callable[[str | Path], None] = refuse_fresh) -> None:
    """The checks of ``out_dir`` that need no checkpoint: ``--resume`` and ``--overwrite`` not both, ``out_dir`` this
    trainer's output or new (:func:`foresight.outputs.check_output`), and a fresh run refused where an earlier run is
    (``refuse``: :func:`refuse_fresh`, or DAgger's)."""
    if resume and overwrite:
        raise ForesightError("--resume continues the run in out_dir and --overwrite replaces it; pass one of them")
    check_output(cfg.out_dir, train_output(cfg), "out_dir", overwrite)
    if not resume and not overwrite:
        refuse(cfg.out_dir)


def make_out_dir(cfg: TrainerConfig, dist: DistInfo, overwrite: bool = False) -> Path:
    """Make ``out_dir`` (rank 0; every rank waits for it), marked as this trainer's output, once the task is built
    (its checks passed; only the feature cache is written before); ``overwrite`` replaces an earlier run of the same
    trainer there, its feature cache kept (:func:`foresight.outputs.prepare_output_dir`)."""
    if dist.is_main:
        prepare_output_dir(cfg.out_dir, train_output(cfg), "out_dir", overwrite)
    barrier()
    return Path(cfg.out_dir)


__all__ = ["FEATURES", "FINISHED_ENTRIES", "TRAIN_ENTRIES", "check_claim", "make_out_dir", "refuse_fresh",
           "train_output"]
