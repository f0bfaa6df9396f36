"""Output directories: a job writes only into a directory that is new, empty, or an earlier output of its own kind.

Every job that writes a directory (``trace``, ``golden``, ``train``, ``eval fidelity``, ``eval aime``, ``bench``,
``export``, the demo) describes it by an :class:`OutputKind` (the names of the entries it writes) and calls
:func:`prepare_output_dir` before its first write, which puts a marker file (:data:`MARKER`, naming the kind) in it.
:func:`check_output` makes the same checks without writing anything, before a model loads. Refused, in one line
naming the directory:

* an empty name (``--out ""`` would be the current directory), the current directory or one of its parents, and a
  symbolic link (a replacement would delete its target);
* a directory marked as another kind's output (``golden`` labels into a trace directory);
* an unmarked directory that is not empty, unless every entry is one this kind writes and the entries of one of its
  ``signatures`` are all there: an output written before markers existed, which is adopted (marked) on the next
  write. A user's own ``fidelity.md`` or ``notes.txt`` is named in the refusal, never overwritten;
* with ``overwrite`` (``export --overwrite``, ``train --overwrite``: the directory is replaced as a whole), a
  directory holding any entry its kind does not write, named in the refusal. Without ``overwrite`` such entries are
  left untouched (nothing is ever written under their names).

The holder of the directory's lock (:mod:`foresight.run_lock`) removes the temporaries that killed writes left in it
and beside it (:func:`foresight.atomic.temp_sibling`'s names, of processes that are gone) when it prepares the
directory.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from foresight.atomic import atomic_write_text, temp_sibling
from foresight.config import ConfigError
from foresight.output_paths import check_output_dir
from foresight.run_lock import holds_lock

MARKER = ".foresight-output.json"
MARKER_FORMAT = "foresight-output/1"


@dataclass(frozen=True)
class OutputKind:
    """What one job writes at the top of its output directory.

    ``name`` is recorded in the marker (``trace``, ``train sl`` ...); ``files`` are ``fnmatch`` patterns of the
    entries it writes; ``signatures`` tell a directory this job wrote before markers existed (with every entry in
    ``files``): each is a tuple of patterns that such a directory matches all of (``bench.json`` and ``bench.md``).
    ``caches`` are entries that an overwrite keeps: caches keyed by what they were made from (a training run's
    ``features/``)."""

    name: str
    files: tuple[str, ...]
    signatures: tuple[tuple[str, ...], ...]
    caches: tuple[str, ...] = ()

    def writes(self, entry: str) -> bool:
        """Whether ``entry`` (a name in the directory) is one this kind writes, or a temporary of one."""
        name = _temporary_of(entry) or entry
        return name == MARKER or any(fnmatch.fnmatchcase(name, p) for p in self.files)


def _temporary_parts(entry: str) -> tuple[str, int | None] | None:
    """``(name, pid)`` of an atomic write's temporary ``.<name>.tmp-<pid>-<hex>`` (or of a replaced folder's
    ``.<name>.old-<pid>-<hex>``), pid None when it names none; None for any other entry."""
    if entry.startswith("."):
        for tag in (".tmp-", ".old-"):
            head, sep, tail = entry[1:].rpartition(tag)
            if sep and head:
                pid = tail.split("-", 1)[0]
                return head, int(pid) if pid.isdigit() else None
    return None


def _temporary_of(entry: str) -> str | None:
    """The name whose temporary ``entry`` is (:func:`_temporary_parts`), else None."""
    parts = _temporary_parts(entry)
    return parts[0] if parts else None


def _writer_gone(pid: int | None) -> bool:
    """Whether the process that wrote a temporary is gone (on this machine): its write can never finish."""
    if pid is None:
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def _shown(entries: list[str], n: int = 3) -> str:
    more = f" and {len(entries) - n} more" if len(entries) > n else ""
    return ", ".join(entries[:n]) + more


def read_marker(path: str | Path) -> str | None:
    """The kind named by ``path``'s marker; None when it has none. A damaged marker is an error naming it."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT or not isinstance(data.get("kind"), str):
        raise ConfigError(f"{marker} is damaged (expected {{\"format\": \"{MARKER_FORMAT}\", \"kind\": ...}}); it "
                          "marks the directory as foresight output: restore it, or choose another output directory")
    return data["kind"]


def write_marker(path: str | Path, kind: OutputKind) -> None:
    """Mark ``path`` (an existing directory) as ``kind``'s output."""
    atomic_write_text(Path(path) / MARKER, json.dumps({"format": MARKER_FORMAT, "kind": kind.name}) + "\n")


def check_output(path: str | Path | None, kind: OutputKind, key: str = "--out",
                 overwrite: bool = False) -> Path | None:
    """Refuse ``path`` as ``kind``'s output directory (see the module docstring) without writing anything; None
    passes. Returns it as a :class:`~pathlib.Path`."""
    if check_output_dir(path, key) is None:
        return None
    p = Path(path).expanduser()
    if not p.is_dir():
        return p
    entries = sorted(os.listdir(p))
    if not [e for e in entries if _temporary_of(e) is None]:  # empty, or stale temporaries only
        return p
    marked = read_marker(p)
    if marked is not None and marked != kind.name:
        raise ConfigError(f"{key} {path} holds `{marked}` output (its {MARKER}), not `{kind.name}` output; choose "
                          f"another {key}")
    foreign = [e for e in entries if not kind.writes(e)]
    if marked is None and foreign:
        raise ConfigError(f"{key} {path} holds entries that are not `{kind.name}` output ({_shown(foreign)}); move "
                          f"them away or choose another {key}")
    if marked is None and not any(all(any(fnmatch.fnmatchcase(e, pattern) for e in entries) for pattern in sig)
                                  for sig in kind.signatures):
        raise ConfigError(f"{key} {path} holds {_shown(entries)} but no {MARKER}: not a `{kind.name}` output that "
                          f"foresight wrote; move them away or choose another {key}")
    if overwrite and foreign:
        raise ConfigError(f"--overwrite would delete entries of {path} that are not `{kind.name}` output "
                          f"({_shown(foreign)}); move them away first, or choose another {key}")
    return p


def prepare_output_dir(path: str | Path, kind: OutputKind, key: str = "--out", overwrite: bool = False) -> Path:
    """:func:`check_output`, then make ``path`` (empty but for ``kind.caches``, when ``overwrite`` replaces an earlier
    output of this kind) and mark it as ``kind``'s. Under the directory's lock (:func:`foresight.run_lock.holds_lock`),
    the stale temporaries of killed writes inside it and beside it are removed first."""
    p = check_output(path, kind, key, overwrite)
    clean_after_killed_writes(p)
    if overwrite and p.is_dir() and any(e != MARKER and e not in kind.caches for e in os.listdir(p)):
        discard_directory(p, keep=kind.caches)
    p.mkdir(parents=True, exist_ok=True)
    if read_marker(p) is None:
        write_marker(p, kind)
    return p


def clean_after_killed_writes(path: Path) -> None:
    """Remove the stale temporaries in and beside ``path`` (:func:`remove_stale_temporaries`) when this process holds
    its lock (:func:`foresight.run_lock.holds_lock`): the directory's one writer, which no other run races."""
    if holds_lock(path):
        remove_stale_temporaries(Path(path))


def discard_directory(path: Path, keep: tuple[str, ...] = ()) -> None:
    """Empty the directory ``path`` (never a link's target) but for its entries named in ``keep``: it is renamed aside
    first (the kept entries moved back into a new ``path``), so a kill mid-way leaves the old entries whole in a
    hidden ``.<name>.old-*`` sibling that the next :func:`prepare_output_dir` removes."""
    aside = temp_sibling(path, "old")
    os.replace(path, aside)
    path.mkdir()
    for name in keep:
        if (aside / name).exists():
            os.replace(aside / name, path / name)
    shutil.rmtree(aside)


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove what killed writes left: ``.<entry>.tmp-*`` / ``.<entry>.old-*`` inside ``path`` and ``.<name>.tmp-*`` /
    ``.<name>.old-*`` beside it, of writers that are gone (a live writer's temporary is kept). Returns the paths
    removed."""
    found = [path / e for e in os.listdir(path)] if path.is_dir() else []
    if path.parent.is_dir():
        found += [path.parent / e for e in os.listdir(path.parent) if _temporary_of(e) == path.name]
    stale = [p for p in found if (parts := _temporary_parts(p.name)) is not None and _writer_gone(parts[1])]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    return stale


__all__ = ["MARKER", "OutputKind", "check_output", "clean_after_killed_writes", "discard_directory",
           "prepare_output_dir", "read_marker", "remove_stale_temporaries", "write_marker"]
