"""Errors a user can fix (bad names, missing files, bad hyperparameters): the CLI prints them in one line.

The machine's limits are errors the user can act on too, with one contract in every job: a full disk
(:class:`DiskFullError`, raised by the writers of :mod:`foresight.atomic` naming the file) and running out of memory
are one line naming the path or the size, exit status 2 (:func:`machine_limit` tells them from other errors,
whatever library raised them), and the writers leave nothing half-written.
"""

from __future__ import annotations

import argparse
import errno
import re
import sys
from typing import Callable, NoReturn


class ForesightError(Exception):
    """Base class of user-facing errors."""


class DiskFullError(ForesightError, OSError):
    """A write that found the disk (or the user's quota) full; the message names the path. An ``OSError`` still, for
    callers that catch the error the write raised."""


_DISK_FULL = ("no space left on device", "disk quota exceeded", "storagefull", "os error 28")
_OOM = ("out of memory", "can't allocate memory", "cannot allocate memory")


def _chain(exc: BaseException):
    """``exc`` and the exceptions it was raised from or during."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or one it came from) is a full disk: ``ENOSPC``/``EDQUOT``, or a library's wrapping of it
    (safetensors, pyarrow and torch's writers report it in their message)."""
    return any((isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT))
               or any(t in str(e).lower() for t in _DISK_FULL) for e in _chain(exc))


def machine_limit(exc: BaseException) -> str | None:
    """One line describing a full disk or an exhausted memory that ``exc`` reports (naming the path or the size it
    gives), None for any other error."""
    for e in _chain(exc):
        if isinstance(e, DiskFullError):
            return str(e)
    if is_disk_full(exc):
        where = next((e.filename for e in _chain(exc) if isinstance(e, OSError) and e.filename), None)
        return (f"disk full{f' writing {where}' if where else ''} (No space left on device); free space on that "
                "filesystem or write elsewhere, then rerun")
    for e in _chain(exc):
        text = str(e)
        if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or any(
                t in text.lower() for t in _OOM):
            size = re.search(r"(?:tried to allocate|Tried to allocate) ([\d.]+ ?[KMGT]?i?B|\d+ bytes)", text)
            what = f" (tried to allocate {size.group(1)})" if size else ""
            return (f"out of memory{what}; lower the batch size (--batch-size, micro_batch, group_size), the budget or "
                    "the sequence length, or use a device with more memory")
    return None


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (``foresight generate: error: argument --top-p: ...``), exit status 2: the parser
    of ``foresight`` and of every stand-alone script."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def run_script(main: Callable[[], int], prog: str) -> NoReturn:
    """Run a stand-alone script's ``main`` under the command line's contract: a :class:`ForesightError` is one
    line on stderr and exit status 2 (benchmark scripts use it; ``foresight`` itself has its own entry point)."""
    try:
        sys.exit(main())
    except ForesightError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
