"""The one model-identity check: was this artefact made with the model it is about to be used with?

Traces, golden labels and scorers record :func:`foresight.model_fingerprint` of the model that made them. Every
place that combines such an artefact with a model (labelling traces, training on labels, replaying labels,
running a scorer, replaying traces) calls :func:`check_same_model`, so there is a single rule. It compares what
determines the features and the cache, not the name a loader gave the model:

* the architecture and shapes (:data:`IDENTITY_KEYS`) must be equal; a field recorded on one side only counts as
  a difference (never assumed equal);
* the RoPE settings (``"rope"``: ``rope_theta``, ``rope_type`` and any scaling of the config) must be equal;
* the weights must be the same numbers (``"weights"``, :func:`weights_digest`): SHA-256 digests of every parameter
  (adapter weights aside), at the model's dtype and at each coarser one, so two copies of a model compare equal
  however they were loaded (``foresight.load_model``, ``AutoModelForCausalLM.from_pretrained`` of a saved copy,
  another path or Hub id), and so does the same model loaded in bf16 or fp16 (compared at the finest precision
  both sides record). One changed weight is a different model;
* the PEFT adapters must be the same (docs/training.md, adaptation): a model loaded with ``--adapter DIR`` records the
  adapter's identity (type, rank, targets and the SHA-256 of its weights file) under ``"adapter"``, and two
  fingerprints agree only when both name no adapter or both name one with the same weights digest. A fingerprint
  without the key means "no adapter".

**Older artefacts.** A fingerprint without ``"weights"`` (traces, labels and scorers made before fingerprints
recorded the weights) is compared the way it was made to be: the model names must be equal after dropping any
directory part (``Qwen/Qwen3-4B``, ``/models/Qwen3-4B`` and ``Qwen3-4B`` are one model), and a warning says that
only the name was checked. ``"rope"`` is compared only where both sides record it. The model name is otherwise a
label for messages and model cards.
"""

from __future__ import annotations

import hashlib
import json
import warnings
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
    """Identity of a model (its architecture, shapes, RoPE, weights and adapter), recorded in traces, labels and
    scorer checkpoints; see the module docstring for how two are compared.

    ``model`` may be a PEFT model (or anything with ``get_base_model``): its base model's weights are digested, and
    ``"adapter"`` records an adapter loaded by :mod:`foresight.adapters`. The weights digest is computed once per
    model and kept while its parameters are unchanged (:func:`weights_digest`).
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
        "rope": rope_settings(cfg),
        "weights": weights_digest(model),
    }
    adapter = getattr(cfg, "foresight_adapter", None)
    if adapter:
        fp["adapter"] = dict(adapter)
    return fp


def rope_settings(cfg) -> dict:
    """The config's RoPE settings as plain JSON values (``rope_theta``, ``rope_type``, scaling factors; transformers
    5 keeps them in ``rope_parameters``, earlier configs in ``rope_theta`` and ``rope_scaling``)."""
    params = getattr(cfg, "rope_parameters", None) or {
        "rope_theta": getattr(cfg, "rope_theta", None), **(getattr(cfg, "rope_scaling", None) or {})}
    out = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
           for k, v in sorted(dict(params).items()) if v is not None}
    if getattr(cfg, "partial_rotary_factor", None) not in (None, 1.0):
        out["partial_rotary_factor"] = float(cfg.partial_rotary_factor)
    return json.loads(json.dumps(out, default=str))


#: Precisions of the weights digest: a model records its own dtype's and every coarser one's, so the same weights
#: loaded in another precision compare equal at the finest precision both record (:func:`fingerprint_diff`).
DIGEST_PRECISIONS = {"float64": ("float32", "bfloat16", "float16"), "float32": ("float32", "bfloat16", "float16"),
                     "bfloat16": ("bfloat16",), "float16": ("float16",)}


def _digest_parameters(model) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of the weights that make the model: every parameter of the base model (a PEFT wrapper
    unwrapped, its adapter weights left to ``"adapter"``), named as in the plain model, sorted by name."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    out = {}
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = p.detach()
    return sorted(out.items())


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place version counter; -1 for an inference tensor, which has none (and cannot change)."""
    try:
        return t._version
    except RuntimeError:
        return -1


def weights_digest(model) -> dict[str, str]:
    """``{precision: SHA-256}`` of the model's weights (:func:`_digest_parameters`: name, shape and the values cast
    to ``precision``, little-endian), for the model's dtype and each coarser one (:data:`DIGEST_PRECISIONS`; a float64
    model, as numerical checks use, digests at float32 and below); a model whose weights mix other dtypes records
    ``{"raw": ...}`` of its bytes.

    The digest is cached on the model, keyed by every parameter's storage and version counter, so it is computed
    once per model (it reads every weight: seconds for SmolLM2-135M in fp32 on a CPU) and again only after the
    weights change."""
    params = _digest_parameters(model)
    key = tuple((n, p.data_ptr(), _version(p), p.dtype, str(p.device)) for n, p in params)
    cached = model.__dict__.get("_foresight_weights_digest")
    if cached is not None and cached[0] == key:
        return dict(cached[1])
    dtypes = {str(p.dtype).removeprefix("torch.") for _, p in params}
    finest = next((d for d in ("float64", "float32") if d in dtypes), None)
    if finest is None:
        finest = next(iter(dtypes)) if len(dtypes) == 1 else "raw"
    precisions = DIGEST_PRECISIONS.get(finest, ("raw",))
    hashes = {prec: hashlib.sha256() for prec in precisions}
    for name, p in params:
        header = f"{name}:{tuple(p.shape)};".encode()
        for prec, h in hashes.items():
            t = p if prec == "raw" else p.to(getattr(torch, prec))
            h.update(header)
            h.update(t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    digest = {prec: h.hexdigest() for prec, h in hashes.items()}
    model.__dict__["_foresight_weights_digest"] = (key, digest)
    return dict(digest)


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


def _weights_diff(a: dict, b: dict) -> str | None:
    """Why the weights digests of ``a`` and ``b`` differ (compared at the finest precision both record), or None."""
    wa, wb = a.get("weights"), b.get("weights")
    if not isinstance(wa, dict) or not isinstance(wb, dict):
        return "weights: recorded on one side only"
    common = [p for p in (*DIGEST_PRECISIONS["float32"], "raw") if p in wa and p in wb]
    if not common:
        return f"weights: digested in {', '.join(wa) or 'nothing'} vs {', '.join(wb) or 'nothing'}, not comparable"
    prec = common[0]
    if wa[prec] != wb[prec]:
        return f"weights ({prec} SHA-256): {str(wa[prec])[:12]}… vs {str(wb[prec])[:12]}…"
    return None


_WARNED: set[str] = set()


def fingerprint_diff(made_with, used_with) -> list[str]:
    """``["key: made-with value vs used-with value", ...]``: what breaks :func:`check_same_model` (empty: same).

    A side without a weights digest (an older artefact) is compared by model name, with a warning (module
    docstring)."""
    a, b = _as_fingerprint(made_with), _as_fingerprint(used_with)
    diff = [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in IDENTITY_KEYS if a.get(k) != b.get(k)]
    if "rope" in a and "rope" in b and a["rope"] != b["rope"]:
        diff.append(f"rope: {a['rope']} vs {b['rope']}")
    if "weights" in a and "weights" in b:
        weights = _weights_diff(a, b)
        if weights:
            diff.append(weights)
    elif model_name(a) != model_name(b):
        diff.insert(0, f"model: {model_name(a)!r} vs {model_name(b)!r}")
    elif not diff and model_name(a) not in _WARNED:
        _WARNED.add(model_name(a))
        warnings.warn(f"a fingerprint of {model_name(a)!r} records no weights digest (made before fingerprints "
                      "recorded one): matched by model name only; re-make or re-export the artefact to record it",
                      stacklevel=3)
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
           "fingerprint_diff", "model_fingerprint", "model_name", "rope_settings", "weights_digest"]
