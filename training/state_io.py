"""Training state as safetensors + JSON, never a pickle (the checkpoint files of :mod:`training.checkpoint`).

* :func:`flatten_state` / :func:`unflatten_state`: a torch ``state_dict`` (optimizer, LR scheduler) as named
  tensors plus a JSON structure whose tensor leaves name them; tuples, lists and dicts keep their kind.
* :func:`rng_state` / :func:`set_rng_state`: this process's torch, CUDA, numpy and Python RNG states.
* :func:`save_tensors` / :func:`load_tensors`: one safetensors file with a JSON value in its header
  (:data:`META_KEY`); a file that does not read back is a ``ForesightError`` naming it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from foresight.errors import ForesightError

META_KEY = "foresight"  # safetensors header key holding the JSON structure


def flatten_state(sd: dict, prefix: str) -> tuple[dict[str, torch.Tensor], dict]:
    """A torch optimizer ``state_dict`` as named tensors plus a JSON-able structure (tensor leaves by name)."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(v, name):
        if isinstance(v, torch.Tensor):
            tensors[name] = v.detach().cpu().clone().contiguous()
            return {"tensor": name}
        if isinstance(v, tuple):
            return {"tuple": [enc(x, f"{name}.{i}") for i, x in enumerate(v)]}
        if isinstance(v, list):
            return {"list": [enc(x, f"{name}.{i}") for i, x in enumerate(v)]}
        if isinstance(v, dict):
            return {"dict": [[k, enc(x, f"{name}.{k}")] for k, x in v.items()]}
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"value": v}
        raise TypeError(f"cannot store {type(v).__name__} at {name} in a checkpoint")

    return tensors, enc(sd, prefix)


def unflatten_state(structure: dict, tensors: dict[str, torch.Tensor]):
    """Inverse of :func:`flatten_state`."""
    if "tensor" in structure:
        return tensors[structure["tensor"]]
    if "tuple" in structure:
        return tuple(unflatten_state(x, tensors) for x in structure["tuple"])
    if "list" in structure:
        return [unflatten_state(x, tensors) for x in structure["list"]]
    if "dict" in structure:
        return {k: unflatten_state(x, tensors) for k, x in structure["dict"]}
    return structure["value"]


def rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    """This process's RNG states: torch (and CUDA, once initialised) and numpy's key as tensors, the rest JSON."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(keys.astype(np.int64))
    version, pystate, pygauss = random.getstate()
    return tensors, {"numpy": [name, int(pos), int(has_gauss), float(gauss)],
                     "python": [version, list(pystate), pygauss]}


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Inverse of :func:`rng_state` (CUDA states only when this process sees as many devices)."""
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    name, pos, has_gauss, gauss = meta["numpy"]
    np.random.set_state((name, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, pystate, pygauss = meta["python"]
    random.setstate((version, tuple(pystate), pygauss))


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], meta: Any) -> None:
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(meta)})


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], Any]:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get(META_KEY, "null"))
            return {k: f.get_tensor(k) for k in f.keys()}, meta
    except (SafetensorError, OSError, ValueError) as exc:
        raise ForesightError(f"--resume: {path} is not a readable safetensors checkpoint file ({exc})") from None
