"""Atomic writes: a file or a folder is either the earlier one, whole, or the new one, never torn.

Each is written under a hidden temporary sibling (``.<name>.tmp-<pid>-<random>``, :func:`temp_sibling`), flushed to
disk (:func:`fsync_path`) and renamed into place. An error removes the temporary; a kill may leave one behind
(:func:`stale_temporaries`), which is safe to delete. Records appended to a log (:func:`append_text`) are whole
lines or nothing. A full disk in any of them raises :class:`~foresight.errors.DiskFullError` naming the file
(:func:`writing`), after the temporary or the partial line is removed.
"""

from __future__ import annotations

import errno
import glob
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from foresight.errors import DiskFullError, is_disk_full


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` (a file, or a folder: its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """A fresh hidden name beside ``path`` for its temporary: ``.<name>.tmp-<pid>-<random>``; ``tag="old"`` names
    the place a directory being replaced is moved aside to (``.<name>.old-<pid>-<random>``)."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def stale_temporaries(path: Path) -> list[Path]:
    """The temporaries of ``path`` that killed writes left beside it (:func:`temp_sibling`'s names)."""
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.tmp-*"))


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn a full disk met in the block (whichever library reports it: :func:`foresight.errors.is_disk_full`) into
    a :class:`~foresight.errors.DiskFullError` naming ``path``; other errors pass unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise DiskFullError(f"disk full writing {path} (No space left on device); free space on that filesystem or "
                            "write elsewhere, then rerun") from None


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` for the block to write; when the block ends without error it is flushed to disk
    and renamed to ``path`` (an existing ``path`` stays whole until then). On an error it is removed."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        with writing(path):
            yield tmp
            fsync_path(tmp)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def append_text(path: str | Path, text: str, mode: str = "a") -> None:
    """Append ``text`` (whole records, e.g. JSON lines) to ``path`` and flush it to disk; ``mode="w"`` starts the file
    afresh. An error mid-write cuts the file back to what it held before, so no partial record is left."""
    path = Path(path)
    size = path.stat().st_size if mode == "a" and path.exists() else 0
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC), 0o666)
        try:
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)
            raise
        finally:
            os.close(fd)


def _replace_dir(tmp: Path, target: Path) -> None:
    """Put the complete directory ``tmp`` at ``target`` by renames (same filesystem); an existing ``target`` is moved
    aside first (put back if the second rename fails) and deleted once the new one is in place."""
    if not target.exists():
        os.replace(tmp, target)
        return
    old = temp_sibling(target, "old")
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except OSError:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_directory(directory: str | Path) -> Iterator[Path]:
    """A hidden temporary sibling of ``directory`` (made as ``mkdir`` makes one: the umask's mode) for the block to
    fill; when the block ends without error its files are flushed to disk and it takes ``directory``'s place by
    renames (an existing ``directory`` stays whole until then, and is deleted after; through a symlink, its
    target is replaced). On an error it is removed, so an error or a kill never leaves a torn ``directory``; a kill
    may leave a ``.<name>.tmp-*`` sibling behind, which is safe to delete."""
    target = Path(directory).resolve()
    if target.exists() and not target.is_dir():
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", str(directory))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(target)
    tmp.mkdir()
    try:
        with writing(directory):
            yield tmp
            for root, _, files in os.walk(tmp):  # symlinks are not followed
                for name in files:
                    if not os.path.islink(os.path.join(root, name)):
                        fsync_path(Path(root, name))
            _replace_dir(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
