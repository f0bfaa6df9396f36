"""What a trained scorer records about how it was made, and which problems a trainer holds out.

:func:`split_problems` is the one held-out split of SL, DAgger and GRPO (by problem, so samples of one problem
never straddle it); :func:`stamp` the code version and time every trainer writes into its scorer's provenance.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
import time
from pathlib import Path

from foresight.errors import ForesightError


def split_problems(problem_ids: list[str], heldout: float, seed: int) -> set[str]:
    """Held-out problem ids: a seeded shuffle of the distinct ids, the last ``heldout`` fraction (or count)."""
    uniq = sorted(set(problem_ids))
    order = sorted(uniq, key=lambda p: hashlib.sha1(f"{seed}\x00{p}".encode()).hexdigest())
    n = int(heldout) if heldout >= 1 else max(1, math.ceil(heldout * len(uniq)))
    if n >= len(uniq):
        raise ForesightError(f"heldout={heldout} leaves no training problems ({len(uniq)} problems in total)")
    return set(order[-n:])


def git_commit() -> str | None:
    """The repository's HEAD commit, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except Exception:
        return None


def stamp() -> dict:
    """``{"git_commit": ..., "created": <UTC ISO time>}`` for a scorer's provenance."""
    return {"git_commit": git_commit(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
