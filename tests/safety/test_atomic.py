"""foresight.atomic: a file or a folder is the earlier one, whole, or the new one; temporaries are hidden siblings."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import foresight.atomic as atomic
from foresight.atomic import atomic_directory, atomic_write_text, stale_temporaries
from tests.conftest import Killed, kill_while_writing


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _record(monkeypatch) -> list[tuple]:
    """Every fsync_path and os.replace, in order (both still done)."""
    calls, fsync, replace = [], atomic.fsync_path, os.replace
    monkeypatch.setattr(atomic, "fsync_path", lambda p: (calls.append(("fsync", Path(p).name)), fsync(p)))
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", Path(a).name, Path(b).name)),
                                                     replace(a, b)))
    return calls


def test_a_text_file_is_flushed_then_renamed_and_a_failed_write_keeps_the_earlier_one(tmp_path, monkeypatch):
    path = tmp_path / "latest"
    with monkeypatch.context() as m:
        calls = _record(m)
        atomic_write_text(path, "step_1")
    (tmp,) = {c[1] for c in calls}
    assert tmp.startswith(".latest.tmp-") and calls == [("fsync", tmp), ("replace", tmp, "latest")]
    with monkeypatch.context() as m:
        kill_while_writing(m, "latest")  # the temporary is truncated, then the "kill"
        with pytest.raises(Killed):
            atomic_write_text(path, "step_2")
    assert path.read_text() == "step_1" and _hidden(tmp_path) == []  # the earlier file; the temporary removed
    atomic_write_text(path, "step_2")
    assert path.read_text() == "step_2" and os.listdir(tmp_path) == ["latest"]


def test_a_directory_is_flushed_then_replaced_whole_and_an_error_keeps_the_earlier_one(tmp_path, monkeypatch):
    out = tmp_path / "d"
    with atomic_directory(out) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "a").write_text("1")
        os.symlink("sub/a", tmp / "link")
    before = _tree(out)
    assert before == {"link": b"1", "sub/a": b"1"} and _hidden(tmp_path) == []

    with monkeypatch.context() as m:
        calls = _record(m)
        with atomic_directory(out) as tmp:
            (tmp / "b").write_text("2")
            os.symlink("b", tmp / "link")
    assert _tree(out) == {"b": b"2", "link": b"2"} and _hidden(tmp_path) == []
    fsynced = [c[1] for c in calls if c[0] == "fsync"]
    assert fsynced == ["b"]  # its files before the renames; a symlink is not followed
    assert [c[0] for c in calls] == ["fsync", "replace", "replace"]  # the earlier one aside, the new one in
    before = _tree(out)

    with pytest.raises(RuntimeError):  # an error in the block
        with atomic_directory(out) as tmp:
            (tmp / "b").write_text("torn")
            raise RuntimeError
    assert _tree(out) == before and _hidden(tmp_path) == []

    replace = os.replace

    def fails_in_place(src, dst):  # the new folder cannot be renamed into place: the earlier one is put back
        if Path(src).name.startswith(".d.tmp-"):
            raise OSError("rename failed")
        replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", fails_in_place)
        with pytest.raises(OSError, match="rename failed"):
            with atomic_directory(out) as tmp:
                (tmp / "b").write_text("new")
    assert _tree(out) == before and _hidden(tmp_path) == []


def test_a_directory_gets_the_umask_mode_and_is_replaced_through_a_symlink(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    umask = os.umask(0o027)
    try:
        with atomic_directory(link) as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(umask)
    assert link.is_symlink() and _tree(real) == {"f": b"x"}  # the link's target replaced, the link kept
    assert stat.S_IMODE(real.stat().st_mode) == 0o750  # as mkdir makes it, not mkdtemp's 0700
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        with atomic_directory(tmp_path / "file"):
            pass


def test_stale_temporaries_are_those_of_the_one_path(tmp_path):
    path = tmp_path / "s[0].json"  # glob characters in the name are taken literally
    left = [tmp_path / ".s[0].json.tmp-1-ab", tmp_path / ".s[0].json.tmp-2-cd"]
    for p in [*left, tmp_path / ".s0.json.tmp-1-ab", tmp_path / ".s[0].jsonx.tmp-1-ab", tmp_path / "s[0].json"]:
        p.write_text("")
    assert stale_temporaries(path) == left
