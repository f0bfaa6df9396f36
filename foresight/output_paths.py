"""Output paths checked before any work (a model load, a benchmark), so a long computation never ends in an
unwritable or wrong path; :func:`foresight.outputs.check_output` adds the checks of what a directory holds."""

from __future__ import annotations

import os
from pathlib import Path

from foresight.config import ConfigError


def check_output_file(path: str | Path | None, key: str) -> str | Path | None:
    """An output file to be written later (None passes): its directory exists and it is not a directory, checked
    before any work so a long computation never ends in an unwritable path."""
    if path is None:
        return None
    if Path(path).is_dir():
        raise ConfigError(f"{key} {path}: is a directory; name a file")
    if not Path(path).parent.is_dir():
        raise ConfigError(f"{key} {path}: its directory does not exist")
    return path


def check_output_dir(path: str | Path | None, key: str) -> str | Path | None:
    """An output directory to be written later (None passes), checked before any work (a model load, a benchmark) so
    it never ends in an unwritable or wrong path: refused when it is empty (``--out ""`` is the current directory),
    the current directory or one of its parents, a symbolic link (replacing it would delete its target), or when it
    or the nearest of its parents that exists is something other than a directory (``mkdir`` would fail there).
    :func:`foresight.outputs.check_output` adds the checks of what is in it."""
    if path is None:
        return path
    if not str(path).strip():
        raise ConfigError(f"{key} is empty; name an output directory")
    p = Path(path).expanduser()
    if p.is_symlink():
        raise ConfigError(f"{key} {path} is a symbolic link (to {os.readlink(p)}); name the directory itself")
    here, resolved = Path.cwd().resolve(), p.resolve()
    if resolved == here or resolved in here.parents:
        which = "the current directory" if resolved == here else "a parent of the current directory"
        raise ConfigError(f"{key} {path} is {which}; name a directory of its own for the output")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key} {path}: exists and is not a directory")
    above = next((a for a in p.parents if a.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"{key} {path}: {above} is not a directory")
    return path


__all__ = ["check_output_dir", "check_output_file"]
