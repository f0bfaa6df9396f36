"""Refuse a ``--resume`` whose settings differ from the ones the saved state was trained with.

The trainers record the settings that define a training (:func:`training.trainer_config.resume_settings`; DAgger its
``rounds/dagger.json``); :func:`check_settings` compares them after a JSON round trip (:func:`plain`) and names
every differing key with both values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from foresight.errors import ForesightError


def plain(settings: dict) -> dict:
    """``settings`` as they read back from JSON (tuples become lists), so saved and current values compare."""
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


def _show(v: Any) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= 60 else s[:57] + "..."


def check_settings(saved: dict, now: dict, where: Path, complete: bool = True) -> None:
    """Refuse to resume when a setting that defines the training differs; name every differing key.

    With ``complete=False`` only the keys of ``now`` are compared (an early check before the data is loaded).
    """
    now = plain(now)
    keys = set(now) | (set(saved) if complete else set())
    missing = object()
    diff = sorted(k for k in keys if saved.get(k, missing) != now.get(k, missing))
    if not diff:
        return
    was = ", ".join(f"{k}={_show(saved.get(k, '(unset)'))}" for k in diff)
    asks = ", ".join(f"{k}={_show(now.get(k, '(unset)'))}" for k in diff)
    raise ForesightError(f"--resume: the checkpoint {where} was trained with {was}, this run asks {asks}; "
                         f"differing: {', '.join(diff)} (resume with the original settings or use another out_dir)")
