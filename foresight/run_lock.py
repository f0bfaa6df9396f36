"""One writer per output directory: an exclusive lock a job holds while it writes there.

Two runs on one output directory (the same command started twice) would share its temporaries and interleave
their records (two ``eval aime`` runs left 90 records for 48 samples; two trainings died on each other's
``checkpoints/.tmp-step_N``). :func:`locked_out_dir` refuses the second at once, in one line naming the directory.

* The lock is a :class:`filelock.FileLock` on ``.<name>.lock`` *beside* the directory (:func:`lock_path`), so that
  taking it, before any check, creates nothing inside it: a run refused later still leaves no directory behind.
* The ranks of one job share its directory: rank 0 alone takes the lock. A trainer (which has a process group)
  passes ``agree``, an all-reduce through which every rank learns rank 0's answer, so all ranks of a refused run
  refuse together; the sharded jobs (``trace``, ``golden``, ``eval aime``) have no process group, and their launcher
  stops the other ranks when rank 0 refuses.
* It is released when the run ends or raises, and by the operating system when the process dies (``flock``).
* It is reentrant within a process (the command line holds it around a command whose library code takes it again),
  and :func:`holds_lock` tells whether this process holds it: only the holder cleans a directory's stale
  temporaries (:func:`foresight.outputs.prepare_output_dir`), which another writer could still be writing.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from foresight.errors import ForesightError

_HELD: set[Path] = set()  # lock files this process holds (every rank records them, so nested uses agree)


def lock_path(out_dir: str | Path) -> Path:
    """The lock file of ``out_dir``: ``.<name>.lock`` beside it (the same for every spelling of the path)."""
    out = Path(out_dir).resolve()
    return out.with_name(f".{out.name}.lock")


def holds_lock(out_dir: str | Path) -> bool:
    """Whether this process holds ``out_dir``'s lock."""
    return lock_path(out_dir) in _HELD


@contextmanager
def locked_out_dir(out_dir: str | Path, key: str = "out_dir", *, what: str = "run", is_main: bool = True,
                   agree: Callable[[bool], bool] | None = None) -> Iterator[Path]:
    """Hold ``out_dir``'s lock for the ``with`` body; ``ForesightError`` at once, naming ``key`` and ``out_dir``, when
    another process holds it. ``is_main``: this process takes it (rank 0; other ranks only agree). ``agree(ok)``
    (collective, every rank calls it) returns whether every rank is ok. Yields the lock file."""
    path = lock_path(out_dir)
    if path in _HELD:
        yield path
        return
    lock, error = None, None
    if is_main:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(path), blocking=False)
            lock.acquire()
        except Timeout:
            lock, error = None, (f"{key} {out_dir} is in use by another {what} (it holds {path}); wait for that "
                                 f"{what} to end, or choose another {key}")
        except OSError as exc:
            lock, error = None, f"{key} {out_dir}: cannot take its lock {path} ({exc})"
    ok = agree(error is None) if agree is not None else error is None
    if error or not ok:
        if lock is not None:
            lock.release()
        raise ForesightError(error or f"{key} {out_dir} is in use by another {what} (rank 0 could not take {path})")
    _HELD.add(path)
    try:
        yield path
    finally:
        _HELD.discard(path)
        if lock is not None:
            lock.release()
