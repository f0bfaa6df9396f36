"""The one model-identity check: was this artefact made with the model it is about to be used with?

Traces, golden labels and scorers record :func:`foresight.model_fingerprint` of the model that made them. Every
place that combines such an artefact with a model (labelling traces, training on labels, replaying labels,
running a scorer, replaying traces) calls :func:`check_same_model`, so there is a single rule:

* the layout and vocabulary fields (:data:`IDENTITY_KEYS`) must be equal; a field recorded on one side only
  counts as a difference (never assumed equal);
* the model names must be equal after dropping any directory part (``Qwen/Qwen3-4B``, ``/models/Qwen3-4B`` and
  ``Qwen3-4B`` are one model; a converted model's cache path differs from machine to machine), so two models of
  one architecture with different weights (a base model and its fine-tune) are still told apart;
* the PEFT adapters must be the same (DESIGN.md section 4b): a model loaded with ``--adapter DIR`` records the
  adapter's identity (type, rank, targets and the SHA-256 of its weights file) under ``"adapter"``, and two
  fingerprints agree only when both name no adapter or both name one with the same weights digest. A fingerprint
  without the key (every artefact made before adapters existed) means "no adapter".
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath

import torch

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
    return model_fingerprint(x)


def model_fingerprint(model) -> dict:
    """Identity of a model's KV layout, weights name and adapter, recorded in traces, labels and scorer checkpoints.

    ``"adapter"`` is present only for a model loaded with a PEFT adapter (:mod:`foresight.adapters`), so the
    fingerprints of models without one are what they were before adapters existed.
    """
    cfg = model.config
    fp = {
        "model": str(getattr(cfg, "_name_or_path", "") or cfg.model_type),
        "model_type": cfg.model_type,
        "num_layers": int(cfg.num_hidden_layers),
        "num_kv_heads": int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        "num_heads": int(cfg.num_attention_heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads),
        "vocab_size": int(cfg.vocab_size),
    }
    adapter = getattr(cfg, "foresight_adapter", None)
    if adapter:
        fp["adapter"] = dict(adapter)
    return fp


def dtype_name(dtype: torch.dtype) -> str | None:
    """The name of a weights dtype as resumable jobs record it (``"bfloat16"``), None for float32: the CPU default is
    recorded as nothing, as ``"adapter"`` in :func:`model_fingerprint`, so what was made before it was recorded
    resumes as before."""
    return None if dtype == torch.float32 else str(dtype).removeprefix("torch.")


def weights_dtype(model) -> dict:
    """``{"dtype": name}`` of a model whose weights are not float32, else ``{}`` (:func:`dtype_name`): recorded in
    what a resumable job computes from the weights (trace and label plans, the feature cache's key), where a resume
    in another precision would mix two computations."""
    name = dtype_name(next(model.parameters()).dtype)
    return {} if name is None else {"dtype": name}


def model_name(fingerprint: dict) -> str:
    """The fingerprint's model name without any directory part (the part that identifies the weights)."""
    name = str(fingerprint.get("model", "") or "").replace("\\", "/").rstrip("/")
    return PurePosixPath(name).name if name else ""


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks (adapter weights, shard manifests, training checkpoints)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def adapter_label(fingerprint: dict) -> str:
    """The fingerprint's adapter in a few words (``"none"``, ``"LORA r=8 sha256 1a2b3c4d5e6f"``), for messages."""
    a = fingerprint.get("adapter") or None
    if not isinstance(a, dict):
        return "none"
    return f"{a.get('peft_type', '?')} r={a.get('r', '?')} sha256 {str(a.get('sha256', '?'))[:12]}"


def _adapter_digest(fingerprint: dict) -> str | None:
    a = fingerprint.get("adapter") or None
    return str(a.get("sha256")) if isinstance(a, dict) else None


def fingerprint_diff(made_with, used_with) -> list[str]:
    """``["key: made-with value vs used-with value", ...]``: what breaks :func:`check_same_model` (empty: same)."""
    a, b = _as_fingerprint(made_with), _as_fingerprint(used_with)
    diff = [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in IDENTITY_KEYS if a.get(k) != b.get(k)]
    if model_name(a) != model_name(b):
        diff.insert(0, f"model: {model_name(a)!r} vs {model_name(b)!r}")
    if _adapter_digest(a) != _adapter_digest(b):
        diff.append(f"adapter: {adapter_label(a)} vs {adapter_label(b)}")
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
        made, used = (f"{fp.get('model')!r}" + (f" + adapter {adapter_label(fp)}" if fp.get("adapter") else "")
                      for fp in (a, b))
        raise error(f"{what}: made with another model ({made}, used with {used}; {'; '.join(diff)}); {fix}")


__all__ = ["IDENTITY_KEYS", "ModelMismatchError", "adapter_label", "check_same_model", "file_sha256",
           "fingerprint_diff", "model_fingerprint", "model_name"]
