"""Metrics logging shared by the trainers: always a local JSONL, optionally Weights & Biases.

Only rank 0 writes. ``report_to="wandb"`` logs to wandb as well; it works offline (``WANDB_MODE=offline``)
and a missing ``wandb`` package or API key only prints a warning, never stops training.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from foresight.atomic import append_text, atomic_write_text

REPORTERS = ("none", "wandb")


class MetricsLogger:
    """Append ``{"step": ..., **metrics}`` records to ``<out_dir>/metrics.jsonl`` (and wandb when enabled).

    Parameters
    ----------
    out_dir
        Run directory; the JSONL goes to ``metrics.jsonl`` inside it.
    enabled
        False on ranks other than 0 (every call becomes a no-op).
    report_to
        ``"none"`` or ``"wandb"``.
    run_config
        Recorded as the wandb run config.
    """

    def __init__(self, out_dir: str | Path, enabled: bool = True, report_to: str = "none",
                 project: str = "foresightkv", run_name: str | None = None, run_config: dict | None = None):
        if report_to not in REPORTERS:
            raise ValueError(f"report_to must be one of {', '.join(REPORTERS)}, got {report_to!r}")
        self.enabled = enabled
        self.path = Path(out_dir) / "metrics.jsonl"
        self._wandb = None
        self._t0 = time.time()
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if report_to == "wandb":
            self._wandb = _start_wandb(project, run_name, run_config or {}, self.path.parent)

    def truncate(self, step: int, redo_eval_at: int | None = None) -> int:
        """On resume from checkpoint ``step``: drop the records a killed run logged after it, so no step repeats.

        Records with ``step <= step`` are kept, except ``eval`` records at ``redo_eval_at`` (the final
        evaluation, which the resumed run does again). A torn last line (killed mid-write) is dropped too. The
        file is replaced atomically. Returns the number of records dropped.
        """
        if not self.enabled or not self.path.is_file():
            return 0
        keep, dropped = [], 0
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
                ok = isinstance(rec, dict) and int(rec["step"]) <= step
                ok = ok and not (rec.get("kind") == "eval" and int(rec["step"]) == redo_eval_at)
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                keep.append(line)
            elif line.strip():
                dropped += 1
        atomic_write_text(self.path, "".join(line + "\n" for line in keep))
        return dropped

    def log(self, step: int, metrics: dict[str, Any], kind: str = "train") -> None:
        if not self.enabled:
            return
        rec = {"step": int(step), "kind": kind, "time": round(time.time() - self._t0, 3)}
        rec.update({k: _plain(v) for k, v in metrics.items()})
        append_text(self.path, json.dumps(rec) + "\n")
        if self._wandb is not None:
            try:
                self._wandb.log({f"{kind}/{k}": v for k, v in rec.items() if isinstance(v, (int, float))}, step=step)
            except Exception as exc:  # a logging backend must never stop training
                print(f"[foresight] wandb.log failed ({exc}); continuing with the local JSONL", file=sys.stderr)
                self._wandb = None

    def close(self) -> None:
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:
                pass
            self._wandb = None


def _plain(v):
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _start_wandb(project: str, run_name: str | None, config: dict, out_dir: Path):
    try:
        import wandb  # optional (the `train` extra): only report_to=wandb needs it
    except ImportError:
        print("[foresight] report_to=wandb but wandb is not installed; logging to metrics.jsonl only", file=sys.stderr)
        return None
    try:
        return wandb.init(project=project, name=run_name, config=config, dir=str(out_dir), reinit=True)
    except Exception as exc:  # no API key while online, network errors, ...
        print(f"[foresight] wandb.init failed ({exc}); set WANDB_MODE=offline to log offline. "
              "Continuing with metrics.jsonl only.", file=sys.stderr)
        return None


def read_metrics(path: str | Path) -> list[dict]:
    """Records of a ``metrics.jsonl`` file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
