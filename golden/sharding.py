"""Resumable, rank-sharded output directories shared by ``foresight trace`` and ``foresight golden``.

An output directory holds ``plan.json`` (the run's settings and its list of work units, each naming the shard
it produces), ``shards/`` and ``manifests/``. A shard is written under a temporary name; its manifest
(``manifests/<shard>.json``: size and SHA-256 of every file) is written next, and the shard is renamed into
place last, so after any kill (even ``kill -9``) a shard either exists whole or not at all. Rerunning with the
same arguments skips a finished shard only after checking it against its manifest; a shard damaged since
(truncated, edited, or without a manifest) is removed and redone. Readers check every file's size and SHA-256
against the manifest too, once per process (:func:`check_shard`), and refuse a damaged shard by name: one token
flipped in a trace is never labelled or scored. A plan names its shards by file name only (:func:`read_plan`), so no
reader follows a plan outside its directory.

When launched with several processes (``torchrun``, the ``deepspeed`` launcher: ``RANK``/``WORLD_SIZE`` set),
rank ``r`` takes the units ``i`` with ``i % world == r`` and writes only its own shards; readers merge shards
in plan order, so the result does not depend on the number of ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from foresight.atomic import atomic_write_text, stale_temporaries, writing
from foresight.config import ConfigError, read_json
from foresight.errors import ForesightError
from foresight.fingerprint import file_sha256  # the one file digest (re-exported for training.checkpoint)
from foresight.outputs import OutputKind, prepare_output_dir

PLAN_FILE = "plan.json"
SHARDS_DIR = "shards"
MANIFESTS_DIR = "manifests"
_TMP_PREFIX = ".tmp-"


def sharded_output(name: str) -> OutputKind:
    """The :class:`~foresight.outputs.OutputKind` of a sharded job's directory (``trace``, ``golden``); one written
    before output markers existed is known by its ``plan.json`` (whose ``kind`` :func:`ensure_plan` checks)."""
    return OutputKind(name, (PLAN_FILE, SHARDS_DIR, MANIFESTS_DIR), ((PLAN_FILE,),))


def rank_world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) when run as a single process."""
    env = {k: os.environ.get(k, d) for k, d in (("RANK", "0"), ("WORLD_SIZE", "1"))}
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except ValueError:
        raise ForesightError(f"invalid RANK={env['RANK']!r} / WORLD_SIZE={env['WORLD_SIZE']!r} in the environment "
                             "(integers expected)") from None
    if world < 1 or not 0 <= rank < world:
        raise ForesightError(f"invalid RANK={rank} / WORLD_SIZE={world} in the environment")
    return rank, world


def my_units(num_units: int, rank: int, world: int) -> list[int]:
    """Unit indices owned by ``rank``: those with ``i % world == rank``."""
    return list(range(rank, num_units, world))


def read_plan(out_dir: str | Path) -> dict | None:
    """The plan of ``out_dir`` (None when there is none); a damaged plan raises an error naming the file."""
    path = Path(out_dir) / PLAN_FILE
    if not path.exists():
        return None
    plan = read_json(path, "plan file")
    units = plan.get("units")
    if not isinstance(plan.get("kind"), str) or not isinstance(units, list) or not all(
        isinstance(u, dict) and isinstance(u.get("shard"), str) for u in units
    ):
        raise ConfigError(f"{path} is damaged (needs `kind` and `units` with a `shard` each); delete the "
                          "directory and rerun, or choose another --out")
    for u in units:
        if not _plain_name(u["shard"]):
            raise ConfigError(f"{path} is damaged: shard {u['shard']!r} is not a file name inside "
                              f"{Path(out_dir) / SHARDS_DIR} (a plan names its own shards, nothing elsewhere); delete "
                              "the directory and rerun, or choose another --out")
    return plan


def _plain_name(name: str) -> bool:
    """A file name of its own: no directory part, not ``.``/``..``, not hidden (temporaries are), no NUL."""
    return bool(name) and name not in (".", "..") and not name.startswith(".") and not any(
        c in name for c in ("/", "\\", "\0", os.sep))


def ensure_plan(out_dir: str | Path, plan: dict, what: str, compare: tuple[str, ...], output: OutputKind,
                units_from: str = "") -> dict:
    """Create ``out_dir`` with ``plan`` (``output``'s directory: :func:`foresight.outputs.prepare_output_dir`), or
    check that an existing plan agrees on the keys in ``compare``.

    Raises :class:`ForesightError` naming every field that differs (e.g. rerunning with another model or
    other settings into the same directory), so a resume can never mix incompatible shards. Differing ``units`` are
    told by their traces (:func:`_unit_differences`), with ``units_from``: the arguments that choose them.
    """
    out = Path(out_dir)
    old = read_plan(out) if out.is_dir() else None
    if old is not None and old.get("kind") != plan.get("kind"):
        raise ForesightError(f"{out} holds {old.get('kind')!r} output, not {what}; choose another --out")
    prepare_output_dir(out, output)
    if old is None:
        (out / SHARDS_DIR).mkdir(exist_ok=True)
        atomic_write_text(out / PLAN_FILE, json.dumps(plan, indent=1, sort_keys=True))
        return plan
    diffs = [d for key in compare for d in (_unit_differences(old.get(key), plan.get(key), units_from)
                                            if key == "units" else _differences(key, old.get(key), plan.get(key)))]
    if diffs:
        raise ForesightError(
            f"{out} already holds {what} made with a different {'; a different '.join(diffs)}; rerun with the "
            "original arguments to resume, or choose another --out"
        )
    (out / SHARDS_DIR).mkdir(exist_ok=True)
    return old


def _differences(key: str, old, new) -> list[str]:
    """``key`` (or each differing ``key.sub``) with both values: every field that differs, none cut off."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str) for d in _differences(f"{key}.{k}", old.get(k),
                                                                                     new.get(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) != len(new):
        return [f"{key} ({len(old)} there, {len(new)} now)"]
    if isinstance(old, list) and isinstance(new, list):
        first = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
        return [f"{key} (from item {first} on: {_short(old[first])} there, {_short(new[first])} now)"]
    return [f"{key} ({_short(old)} there, {_short(new)} now)"]


def _unit_differences(old, new, units_from: str) -> list[str]:
    """Two plans' ``units`` told by what a user chose: how many traces, which, and how many per shard (``units (2
    there, 1 now)`` counts shards and names no argument, e.g. the ``--limit`` that changed)."""
    ids = [[t for u in units for t in u.get("trace_ids") or ()] if isinstance(units, list) else None
           for units in (old, new)]
    if old == new or None in ids:
        return _differences("units", old, new)
    (a, b), by = ids, f"; set by {units_from}" if units_from else ""
    if len(a) != len(b):
        return [f"number of traces ({len(a)} there, {len(b)} now{by})"]
    if a != b:
        first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return [f"list of traces (from trace {first} on: {_short(a[first])} there, {_short(b[first])} now{by})"]
    return [f"split of the traces into shards ({len(old)} there, {len(new)} now{by})"]


def _short(value, n: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= n else text[: n - 3] + "..."


def shard_path(out_dir: str | Path, name: str) -> Path:
    return Path(out_dir) / SHARDS_DIR / name


def clean_stale(out_dir: str | Path, names: list[str]) -> None:
    """Remove temporaries left by killed runs for the shards in ``names`` (the caller's own shards only)."""
    owned = set(names)
    for folder in (SHARDS_DIR, MANIFESTS_DIR):
        for p in (Path(out_dir) / folder).glob(f"{_TMP_PREFIX}*"):
            base = p.name[len(_TMP_PREFIX) :].rsplit("-pid", 1)[0]
            if base in owned or base.removesuffix(".json") in owned:
                _remove(p)
    for name in names:
        for p in stale_temporaries(_manifest_path(shard_path(out_dir, name))):
            _remove(p)


def _remove(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _manifest_path(final: Path) -> Path:
    """``<out>/manifests/<shard>.json`` for the shard ``<out>/shards/<shard>``."""
    return final.parent.parent / MANIFESTS_DIR / f"{final.name}.json"


def _derived_cache(path: Path, root: Path) -> bool:
    """A ``datasets`` cache file (``cache-<fingerprint>.arrow``) that ``Dataset.filter`` / ``map`` / ``select``
    write beside a loaded dataset's own files: derived from the shard, never read back as its data."""
    return path.parent == root and path.name.startswith("cache-") and path.suffix == ".arrow"


def _shard_files(root: Path) -> dict[str, Path]:
    """``{relative path: path}`` of a shard's files (one file, or a directory's files; ``datasets``' derived cache
    files are not the shard's)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not
                                                 _derived_cache(p, root))
    return {"." if p == root else p.relative_to(root).as_posix(): p for p in files}


def _describe_files(root: Path) -> dict[str, dict]:
    """``{relative path: {"size": bytes, "sha256": hex}}`` of a shard's files (:func:`_shard_files`)."""
    return {rel: {"size": p.stat().st_size, "sha256": file_sha256(p)} for rel, p in _shard_files(root).items()}


def shard_problem(out_dir: str | Path, name: str) -> str | None:
    """Why shard ``name`` cannot be used (missing, no manifest, a file missing or extra, a size or SHA-256 that
    differs from the manifest's), or None. Sizes are compared first: a truncated shard is not hashed."""
    final = shard_path(out_dir, name)
    if not final.exists():
        return "missing"
    mpath = _manifest_path(final)
    if not mpath.is_file():
        return "no manifest to check it against"
    try:
        want = json.loads(mpath.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        want = None
    if not isinstance(want, dict) or not all(isinstance(w, dict) for w in want.values()):
        return f"its manifest {mpath} is damaged"
    got = _shard_files(final)
    for rel in sorted(set(want) | set(got)):
        if rel not in want or rel not in got:
            return f"file {rel} {'is missing' if rel not in got else 'is not in the manifest'}"
        size = got[rel].stat().st_size
        if want[rel].get("size") != size:
            return f"file {rel} has {size} bytes, {want[rel].get('size')} were written"
    for rel in sorted(want):
        if want[rel].get("sha256") != file_sha256(got[rel]):
            return f"file {rel} changed since it was written (SHA-256 differs)"
    return None


def recorded_digest(final: str | Path) -> str | None:
    """SHA-256 of the per-file SHA-256s that shard ``final`` (``<out>/shards/<name>``) recorded in its manifest
    when it was written: its content's identity without reading it again. None for a path outside a shards
    directory, or a shard without a manifest that records every file's digest."""
    final = Path(final)
    if final.parent.name != SHARDS_DIR:
        return None
    try:
        files = json.loads(_manifest_path(final).read_text())["files"]
        digests = {rel: entry["sha256"] for rel, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not digests or not all(isinstance(d, str) and d for d in digests.values()):
        return None
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


_VERIFIED: dict[str, tuple] = {}  # shard path -> the files' stat signature when this process verified it


def _signature(final: Path) -> tuple:
    """What changes when a shard or its manifest is rewritten: every file's size, mtime and inode."""
    return tuple((str(p), (st := p.stat()).st_size, st.st_mtime_ns, st.st_ino)
                 for p in [_manifest_path(final), *_shard_files(final).values()] if p.exists())


def check_shard(out_dir: str | Path, name: str, fix: str) -> bool:
    """For readers: True when shard ``name`` is finished, False when it is not there yet; a damaged shard (a file's
    size or SHA-256 differs from its manifest, or no manifest vouches for it) raises :class:`ForesightError` naming it
    (``fix`` says how to redo it). A shard is hashed once per process, again only when its files change."""
    final = shard_path(out_dir, name)
    if not final.exists():
        return False
    signature = _signature(final)
    if _VERIFIED.get(str(final)) == signature:
        return True
    problem = shard_problem(out_dir, name)
    if problem == "missing":
        return False
    if problem:
        raise ForesightError(f"shard {final} is damaged ({problem}); {fix}")
    _VERIFIED[str(final)] = signature
    return True


def unfinished_shards(out_dir: str | Path, names: list[str]) -> list[str]:
    """The shards of ``names`` to (re)do on this run: missing ones, and damaged ones, which are removed first
    (a note on stderr names each). Finished shards are verified against their manifest (sizes and SHA-256)."""
    todo = []
    for name in names:
        problem = shard_problem(out_dir, name)
        if problem is None:
            continue
        if problem != "missing":
            print(f"note: redoing shard {shard_path(out_dir, name)}: {problem}", file=sys.stderr)
            final = shard_path(out_dir, name)
            _remove(_manifest_path(final))
            _remove(final)
        todo.append(name)
    return todo


@contextmanager
def atomic_output(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success write ``final``'s manifest (sizes and SHA-256 of
    its files), then rename the temporary to ``final`` (file or directory)."""
    tmp = final.with_name(f"{_TMP_PREFIX}{final.name}-pid{os.getpid()}")
    if tmp.exists():
        _remove(tmp)
    try:
        with writing(final):  # a full disk: one line naming the shard, and no temporary left
            yield tmp
            manifest = {"shard": final.name, "files": _describe_files(tmp)}
            mpath = _manifest_path(final)
            mpath.parent.mkdir(exist_ok=True)
            atomic_write_text(mpath, json.dumps(manifest, indent=1, sort_keys=True))
            if final.exists():  # a damaged shard being redone by a caller that did not remove it
                _remove(final)
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            _remove(tmp)
