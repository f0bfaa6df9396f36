"""PEFT adapters on top of a loaded model: check a directory, identify it, attach it (docs/training.md, adaptation).

Any job that loads a model takes ``--adapter DIR`` (``load_model(..., adapter=DIR)``): a directory in peft's own
format (``adapter_config.json`` + ``adapter_model.safetensors``, as ``PeftModel.save_pretrained`` writes it and
``foresight train adapt`` / ``foresight export`` produce it). So a LoRA-tuned reasoning model can be traced,
labelled, trained against and evaluated under eviction like any other model.

* **Merged for inference** (the default): ``PeftModel.from_pretrained`` then ``merge_and_unload``, so the budgeted
  cache, its forward hooks and the attention routing see a plain transformers model and pay nothing per token.
* **Unmerged** (``merge=False``): the :class:`peft.PeftModel`, LoRA weights trainable and the base frozen, for
  training on top of the adapter (``disable_adapter()`` then gives the base model back).
* **Identity**: the adapter's type, rank, alpha, target modules and the SHA-256 of its weights file are recorded in
  the model's config (``foresight_adapter``) and from there in :func:`foresight.model_fingerprint`, so traces,
  labels and scorers made with and without it (or with another adapter) are refused when mixed
  (:func:`foresight.fingerprint.check_same_model`).
* **Base model**: an adapter made by ``foresight train adapt`` records its base model's fingerprint
  (``foresight_adapter.json``) and is checked against it exactly; any other adapter's
  ``base_model_name_or_path`` must name the model (directory part ignored, case-insensitive, or a built-in
  alias). Shapes that do not fit are refused too (peft's loading error, in one line).

Weights are read from safetensors only: a directory holding only ``adapter_model.bin`` (a pickle) is refused,
never unpickled.

Anchors: LoRA (Hu et al. 2021, https://arxiv.org/abs/2106.09685); kvpress's LoRA adapters that restore accuracy
under compression; Dynamic Memory Sparsification (https://arxiv.org/abs/2506.05345) retrofits compression into
a model by training it under that compression.
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from pathlib import Path

from foresight.errors import ForesightError
from foresight.fingerprint import check_same_model, file_sha256, model_fingerprint, model_name

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Written by ``foresight train adapt`` next to peft's files: the base model's fingerprint and the policy, B and W
#: the adapter was trained under (peft ignores the file).
TRAINING_META = "foresight_adapter.json"
#: Built-in model names and the Hugging Face ids of the same weights (an adapter trained on the Hub model fits).
BASE_ALIASES = {"smollm2-135m": ("smollm2-135m-instruct",)}


class AdapterError(ForesightError):
    """An adapter directory that cannot be used (missing files, not peft's format, made for another model)."""


def read_adapter_config(path: str | Path) -> dict:
    """``adapter_config.json`` of the adapter directory ``path``, checked: exists, parses, names a peft type,
    and the weights are in ``adapter_model.safetensors``. Raises :class:`AdapterError` naming the directory."""
    path = Path(path)
    if not path.is_dir():
        raise AdapterError(f"adapter directory not found: {path}" if not path.exists()
                           else f"adapter {path} is a file; pass the directory holding {ADAPTER_CONFIG}")
    cfg_file = path / ADAPTER_CONFIG
    if not cfg_file.is_file():
        raise AdapterError(f"adapter {path} has no {ADAPTER_CONFIG}; is it a peft adapter directory "
                           "(PeftModel.save_pretrained output)?")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"adapter {cfg_file} is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("peft_type"), str):
        raise AdapterError(f"adapter {cfg_file} names no peft_type; is it a peft adapter config?")
    if not (path / ADAPTER_WEIGHTS).is_file():
        extra = (" (adapter_model.bin is a pickle, which is never loaded; re-save it with safetensors)"
                 if (path / "adapter_model.bin").exists() else "")
        raise AdapterError(f"adapter {path} has no {ADAPTER_WEIGHTS}{extra}")
    return cfg


def read_training_meta(path: str | Path) -> dict | None:
    """``foresight_adapter.json`` of an adapter trained by ``foresight train adapt`` (None for other adapters)."""
    meta = Path(path) / TRAINING_META
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"adapter {meta} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise AdapterError(f"adapter {meta} must hold a JSON object")
    return data


def adapter_identity(path: str | Path) -> dict:
    """What the model fingerprint records of an adapter: type, rank, alpha, targets, base name, weights SHA-256."""
    path = Path(path)
    cfg = read_adapter_config(path)
    targets = cfg.get("target_modules")
    targets = sorted(targets) if isinstance(targets, list) else targets
    return {"peft_type": cfg["peft_type"], "r": cfg.get("r"), "lora_alpha": cfg.get("lora_alpha"),
            "target_modules": targets, "base_model": cfg.get("base_model_name_or_path"),
            "sha256": file_sha256(path / ADAPTER_WEIGHTS)}


def _same_base(recorded: str | None, name: str) -> bool:
    if not recorded:
        return True  # peft records no base: nothing to compare, the shapes decide
    want = model_name({"model": recorded}).lower()
    have = model_name({"model": name}).lower()
    return want == have or want in BASE_ALIASES.get(have, ())


def check_base(path: str | Path, model, fix: str | None = None) -> None:
    """Refuse an adapter made for another base model (see the module docstring for the rule). ``model`` is a
    loaded model or the fingerprint of one (a scorer's, by ``foresight export``); ``fix`` replaces the advice."""
    path = Path(path)
    fingerprint = model if isinstance(model, dict) else model_fingerprint(model)
    name = str(model.get("model", "")) if isinstance(model, dict) else getattr(model.config, "_name_or_path", "")
    meta = read_training_meta(path)
    if meta is not None and isinstance(meta.get("base_fingerprint"), dict):
        check_same_model(meta["base_fingerprint"], fingerprint, f"adapter {path}", error=AdapterError,
                         fix=fix or "load it on the model it was trained on (--model)")
        return
    recorded = read_adapter_config(path).get("base_model_name_or_path")
    if not _same_base(recorded, name):
        raise AdapterError(f"adapter {path} was made for {recorded!r}, not for the model {name or '?'!r}; "
                           f"{fix or 'load it on its base model (--model)'}")


def does_not_fit(path: str | Path, exc: BaseException, key: str = "adapter") -> AdapterError:
    """The one-line error for adapter weights that peft or torch could not load into the model (``key`` names the
    option that gave the directory)."""
    msg = " ".join(str(exc).split())
    return AdapterError(f"{key} {path} does not fit this model ({type(exc).__name__}: {msg[:300]})")


def attach_adapter(model, path: str | Path, merge: bool = True):
    """``model`` with the peft adapter at ``path``: merged into its weights (default) or as a trainable
    :class:`peft.PeftModel` (``merge=False``). The adapter's identity goes into ``model.config.foresight_adapter``.
    """
    from peft import PeftModel  # lazy: `import foresight` loads this module; peft adds ~0.2 s to it

    path = Path(path)
    identity = adapter_identity(path)
    if getattr(model.config, "foresight_adapter", None):
        raise AdapterError(f"adapter {path}: the model already carries an adapter; merge it into a model directory "
                           "first (one --adapter per model)")
    check_base(path, model)
    with quiet_peft():
        try:
            peft_model = PeftModel.from_pretrained(model, str(path), is_trainable=not merge)
        except (ValueError, RuntimeError, KeyError, TypeError, OSError) as exc:
            raise does_not_fit(path, exc) from None
        model.config.foresight_adapter = identity
        if not merge:
            return peft_model
        merged = peft_model.merge_and_unload()
    merged.config.foresight_adapter = identity
    return merged


@contextmanager
def quiet_peft():
    """peft reads an attribute that transformers 5 deprecates (a FutureWarning per call): not the user's concern."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "AdapterError", "TRAINING_META", "adapter_identity",
           "attach_adapter", "check_base", "does_not_fit", "quiet_peft", "read_adapter_config", "read_training_meta"]
