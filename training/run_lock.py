"""One training run per ``out_dir``: an exclusive lock the trainers hold for the whole run.

Two runs on one ``out_dir`` (the same command started twice) would share its checkpoint temporaries, metrics and
scorer; one of them died on the other's ``checkpoints/.tmp-step_N``. :func:`locked_out_dir` refuses the second at
once, in one line naming ``out_dir``.

* The lock is a :class:`filelock.FileLock` on ``.<name>.lock`` *beside* ``out_dir`` (:func:`lock_path`), so that
  taking it, before any check, creates nothing inside ``out_dir``: a run refused later still leaves no
  ``out_dir`` behind.
* The ranks of one run share ``out_dir``: rank 0 alone takes the lock and every rank learns its answer through an
  all-reduce, so all ranks of a refused run refuse together and no rank of a running one is refused.
* It is released when the run ends or raises, and by the operating system when the process dies (``flock``).
* It is reentrant within a process (:func:`training.sl.run_sl` holds it around :func:`training.loop.run_task`).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from filelock import FileLock, Timeout

from foresight.errors import ForesightError
from training.distributed import DistInfo, all_reduce

_HELD: set[Path] = set()  # lock files this process holds (every rank records them, so nested uses agree)


def lock_path(out_dir: str | Path) -> Path:
    """The lock file of ``out_dir``: ``.<name>.lock`` beside it (the same for every spelling of the path)."""
    out = Path(out_dir).resolve()
    return out.with_name(f".{out.name}.lock")


@contextmanager
def locked_out_dir(out_dir: str | Path, dist: DistInfo) -> Iterator[Path]:
    """Hold ``out_dir``'s lock for the ``with`` body (collective: every rank enters it); ``ForesightError`` at
    once when another run holds it. Yields the lock file."""
    path = lock_path(out_dir)
    if path in _HELD:
        yield path
        return
    lock, error = None, None
    if dist.is_main:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(path), blocking=False)
            lock.acquire()
        except Timeout:
            lock, error = None, (f"out_dir {out_dir} is in use by another training run (it holds {path}); wait "
                                 "for that run to end, or choose another out_dir")
        except OSError as exc:
            lock, error = None, f"out_dir {out_dir}: cannot take its lock {path} ({exc})"
    ok = torch.tensor([0.0 if error else 1.0], device=dist.device)
    all_reduce(ok, "min")
    if error or ok.item() == 0:
        raise ForesightError(error or f"out_dir {out_dir} is in use by another training run (rank 0 could not "
                                      f"take {path})")
    _HELD.add(path)
    try:
        yield path
    finally:
        _HELD.discard(path)
        if lock is not None:
            lock.release()
