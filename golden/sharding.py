"""Resumable, rank-sharded output directories shared by ``foresight trace`` and ``foresight golden``.

An output directory holds ``plan.json`` (the run's settings and its list of work units, each naming the shard
it produces) and ``shards/``. A shard is written under a temporary name and renamed into place only once it
is complete, so after any kill (even ``kill -9``) a shard either exists whole or not at all; the finished
shards *are* the manifest of finished work. Rerunning with the same arguments skips them.

When launched with several processes (``torchrun``, the ``deepspeed`` launcher: ``RANK``/``WORLD_SIZE`` set),
rank ``r`` takes the units ``i`` with ``i % world == r`` and writes only its own shards; readers merge shards
in plan order, so the result does not depend on the number of ranks.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from foresight.errors import ForesightError

PLAN_FILE = "plan.json"
SHARDS_DIR = "shards"
_TMP_PREFIX = ".tmp-"


def rank_world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) when run as a single process."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world < 1 or not 0 <= rank < world:
        raise ForesightError(f"invalid RANK={rank} / WORLD_SIZE={world} in the environment")
    return rank, world


def my_units(num_units: int, rank: int, world: int) -> list[int]:
    """Unit indices owned by ``rank``: those with ``i % world == rank``."""
    return list(range(rank, num_units, world))


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_plan(out_dir: str | Path) -> dict | None:
    path = Path(out_dir) / PLAN_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def ensure_plan(out_dir: str | Path, plan: dict, what: str, compare: tuple[str, ...]) -> dict:
    """Create ``out_dir`` with ``plan``, or check that an existing plan agrees on the keys in ``compare``.

    Raises :class:`ForesightError` naming the first key that differs (e.g. rerunning with another model or
    other settings into the same directory), so a resume can never mix incompatible shards.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / SHARDS_DIR).mkdir(exist_ok=True)
    old = read_plan(out)
    if old is None:
        atomic_write_text(out / PLAN_FILE, json.dumps(plan, indent=1, sort_keys=True))
        return plan
    if old.get("kind") != plan.get("kind"):
        raise ForesightError(f"{out} holds {old.get('kind')!r} output, not {what}; choose another --out")
    for key in compare:
        if old.get(key) != plan.get(key):
            raise ForesightError(
                f"{out} already holds {what} made with a different {key} "
                f"({_short(old.get(key))} there, {_short(plan.get(key))} now); "
                "rerun with the original arguments to resume, or choose another --out"
            )
    return old


def _short(value, n: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= n else text[: n - 3] + "..."


def shard_path(out_dir: str | Path, name: str) -> Path:
    return Path(out_dir) / SHARDS_DIR / name


def clean_stale(out_dir: str | Path, names: list[str]) -> None:
    """Remove temporaries left by killed runs for the shards in ``names`` (the caller's own shards only)."""
    shards = Path(out_dir) / SHARDS_DIR
    owned = set(names)
    for p in shards.glob(f"{_TMP_PREFIX}*"):
        base = p.name[len(_TMP_PREFIX) :].rsplit("-pid", 1)[0]
        if base in owned:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


@contextmanager
def atomic_output(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success rename it to ``final`` (file or directory)."""
    tmp = final.with_name(f"{_TMP_PREFIX}{final.name}-pid{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
