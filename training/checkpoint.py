"""Checkpoints and resumption shared by the trainers.

A checkpoint is written every ``checkpoint_every`` steps through DeepSpeed's ``engine.save_checkpoint`` (all
ranks call it; with ZeRO stage 0 only rank 0 writes files, with ZeRO stages 1-2 each rank adds its optimizer
partition). It holds the scorer weights, the optimizer and LR-scheduler state, and a ``client_state`` with the
trainer's counters (step, skipped steps) and rank 0's RNG states. Rank 0 also writes a ready-to-use scorer
directory (``scorer/``, :meth:`foresight.scorer.Scorer.save_pretrained`) next to it.

Layout: ``<out_dir>/checkpoints/step_000100/...`` and DeepSpeed's ``latest`` file naming the newest tag.
Data order is a pure function of (seed, step) (see :class:`training.loop.StepSampler`), so resuming from a
step replays the same batches as an uninterrupted run.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch

CHECKPOINTS = "checkpoints"


def tag_for(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINTS


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(state: dict | None) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def latest_step(out_dir: str | Path) -> int | None:
    """Step of the newest complete checkpoint under ``out_dir`` (None when there is none)."""
    latest = checkpoint_root(out_dir) / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text().strip()
    try:
        return int(tag.split("_")[-1])
    except ValueError:
        return None


def save(engine, out_dir: str | Path, step: int, client_state: dict, is_main: bool, keep_last: int = 0) -> Path:
    """Write checkpoint ``step`` (collective: every rank must call it)."""
    root = checkpoint_root(out_dir)
    tag = tag_for(step)
    engine.save_checkpoint(str(root), tag=tag, client_state={**client_state, "rng": rng_state()})
    if is_main:
        module = engine.module
        if hasattr(module, "save_pretrained"):
            module.save_pretrained(root / tag / "scorer")
        if keep_last > 0:
            old = sorted(p for p in root.glob("step_*") if p.is_dir() and p.name != tag)
            for p in old[: max(0, len(old) - (keep_last - 1))]:
                shutil.rmtree(p, ignore_errors=True)
    return root / tag


def load(engine, out_dir: str | Path) -> dict | None:
    """Restore the newest checkpoint into ``engine`` (weights, optimizer, scheduler); return its client state."""
    root = checkpoint_root(out_dir)
    if latest_step(out_dir) is None:
        return None
    path, client = engine.load_checkpoint(
        str(root), load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if path is None:
        return None
    set_rng_state((client or {}).get("rng"))
    return client or {}
