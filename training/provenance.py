"""What a trained scorer records about how it was made, and which problems a trainer holds out.

:func:`split_problems` is the one held-out split of SL, DAgger, GRPO and e2e (by problem, so samples of one problem
never straddle it), :func:`split_traces` the traces GRPO and e2e replay, split by it; :func:`stamp` the code
version and time every trainer writes into its scorer's provenance; :func:`add_refinement` the record of a GRPO or
e2e stage, which keeps the records of the stages before it.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from foresight.errors import ForesightError
from foresight.scorer import scorer_sha256
from golden.traces import load_traces


def split_problems(problem_ids: list[str], heldout: float, seed: int) -> set[str]:
    """Held-out problem ids: a seeded shuffle of the distinct ids, the last ``heldout`` fraction (or count)."""
    uniq = sorted(set(problem_ids))
    order = sorted(uniq, key=lambda p: hashlib.sha1(f"{seed}\x00{p}".encode()).hexdigest())
    n = int(heldout) if heldout >= 1 else max(1, math.ceil(heldout * len(uniq)))
    if n >= len(uniq):
        raise ForesightError(f"heldout={heldout} leaves no training problems ({len(uniq)} problems in total)")
    return set(order[-n:])


def split_traces(traces, max_traces: int, budget: int, interval: int, heldout: float,
                 seed: int) -> tuple[list[str], list[dict], list[dict]]:
    """The model fingerprints of ``traces`` and its training and held-out rows: every finished trace sorted by id, the
    first ``max_traces`` (0: all), those longer than ``B + W + 1`` (a shorter one reaches no scored position), split
    by problem with :func:`split_problems`."""
    rows = sorted(load_traces(traces), key=lambda r: r["trace_id"])
    fingerprints = sorted({r["fingerprint"] for r in rows if r.get("fingerprint")})
    if max_traces:
        rows = rows[:max_traces]
    rows = [r for r in rows if len(r["input_ids"]) > budget + interval + 1]
    if not rows:
        raise ForesightError(f"no trace of {traces} is longer than B + W = {budget + interval}")
    held = split_problems([r["problem_id"] for r in rows], heldout, seed)
    return (fingerprints, [r for r in rows if r["problem_id"] not in held],
            [r for r in rows if r["problem_id"] in held])


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


def add_refinement(provenance: dict, stage: str, cfg: Any, budget: int, interval: int, train_rows: list[dict],
                   val_rows: list[dict]) -> dict:
    """``provenance`` with the record of a refinement stage (``"grpo"``, ``"e2e"``) of the scorer ``cfg.init_scorer``
    (its path and weights' SHA-256), on ``train_rows`` with ``val_rows`` held out. A scorer refined by the same
    kind of stage before keeps that earlier record: it moves to ``earlier_stages`` (oldest first, each naming its
    ``stage``), so a scorer refined twice still says how it was made."""
    out = dict(provenance)
    if stage in out:
        out["earlier_stages"] = [*out.get("earlier_stages", []), {"stage": stage, **out[stage]}]
    out[stage] = {
        "init_scorer": str(cfg.init_scorer), "init_scorer_sha256": scorer_sha256(cfg.init_scorer),
        "traces": cfg.traces, "budget": budget, "interval": interval,
        "train_traces": [r["trace_id"] for r in train_rows], "heldout_traces": [r["trace_id"] for r in val_rows],
        **stamp(), "config": asdict(cfg)}
    return out
