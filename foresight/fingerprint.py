"""The one model-identity check: was this artefact made with the model it is about to be used with?

Traces, golden labels and scorers record :func:`foresight.model_fingerprint` of the model that made them. Every
place that combines such an artefact with a model (labelling traces, training on labels, replaying labels,
running a scorer, replaying traces) calls :func:`check_same_model`, so there is a single rule:

* the layout and vocabulary fields (:data:`IDENTITY_KEYS`) must be equal; a field recorded on one side only
  counts as a difference (never assumed equal);
* the model names must be equal after dropping any directory part (``Qwen/Qwen3-4B``, ``/models/Qwen3-4B`` and
  ``Qwen3-4B`` are one model; a converted model's cache path differs from machine to machine), so two models of
  one architecture with different weights (a base model and its fine-tune) are still told apart.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from foresight.errors import ForesightError

#: Fingerprint fields that must agree exactly (besides the model name).
IDENTITY_KEYS = ("model_type", "num_layers", "num_kv_heads", "num_heads", "head_dim", "vocab_size")


class ModelMismatchError(ForesightError):
    """An artefact (traces, labels, scorer) is used with a model other than the one that made it."""


def _as_fingerprint(x) -> dict:
    if isinstance(x, dict):
        return x
    if isinstance(x, str):
        try:
            fp = json.loads(x)
        except json.JSONDecodeError:
            fp = None
        if not isinstance(fp, dict):
            raise ForesightError(f"not a model fingerprint (a JSON object): {x[:80]!r}")
        return fp
    from foresight.models import model_fingerprint

    return model_fingerprint(x)


def model_name(fingerprint: dict) -> str:
    """The fingerprint's model name without any directory part (the part that identifies the weights)."""
    name = str(fingerprint.get("model", "") or "").replace("\\", "/").rstrip("/")
    return PurePosixPath(name).name if name else ""


def fingerprint_diff(made_with, used_with) -> list[str]:
    """``["key: made-with value vs used-with value", ...]``: what breaks :func:`check_same_model` (empty: same)."""
    a, b = _as_fingerprint(made_with), _as_fingerprint(used_with)
    diff = [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in IDENTITY_KEYS if a.get(k) != b.get(k)]
    if model_name(a) != model_name(b):
        diff.insert(0, f"model: {model_name(a)!r} vs {model_name(b)!r}")
    return diff


def check_same_model(made_with, used_with, what: str, fix: str = "use the model it was made with (--model)",
                     error: type[ForesightError] = ModelMismatchError) -> None:
    """Raise ``error`` unless ``used_with`` is the model ``made_with`` describes.

    Parameters
    ----------
    made_with
        The fingerprint recorded in the artefact (dict or its JSON).
    used_with
        A loaded model, or a fingerprint (dict or JSON).
    what
        The artefact, for the message, e.g. ``"scorer runs/sl/scorer"`` or ``"labels labels-00000.safetensors"``.
    fix
        How the user fixes it, appended to the message.
    error
        The :class:`ForesightError` subclass to raise (callers keep their own error types).
    """
    diff = fingerprint_diff(made_with, used_with)
    if diff:
        a, b = _as_fingerprint(made_with), _as_fingerprint(used_with)
        raise error(f"{what}: made with another model ({a.get('model')!r}, used with {b.get('model')!r}; "
                    f"{'; '.join(diff)}); {fix}")


__all__ = ["IDENTITY_KEYS", "ModelMismatchError", "check_same_model", "fingerprint_diff", "model_name"]
