"""A scorer directory's files on disk: its weights read and checked (safetensors only, nothing unpickled), written
byte-stable, and the other files of a directory carried into its replacement (:mod:`foresight.scorer`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from foresight.errors import ForesightError


def read_weights(weights: Path) -> dict[str, torch.Tensor]:
    """The tensors of a scorer's safetensors file, each floating point and finite, ``feature_std`` positive: a NaN or
    Inf weight ranks at random while looking healthy. Anything else is a :class:`ForesightError` naming the file
    and the tensor."""
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ForesightError(f"{weights} is not a readable safetensors file ({exc})") from None
    for name, tensor in state.items():
        if not tensor.is_floating_point():  # load_state_dict would cast it to float32 without a word
            raise ForesightError(f"{weights}: tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')}, "
                                 "not floating point; the file is not a scorer's weights")
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ForesightError(f"{weights}: tensor {name!r} holds {bad} NaN/Inf value(s); the scorer is "
                                 "broken (retrain it, or resume from an earlier checkpoint)")
    std = state.get("feature_std")
    if std is not None and not bool((std > 0).all()):  # features are divided by it: inf, or their sign flipped
        raise ForesightError(f"{weights}: tensor 'feature_std' holds {int((std <= 0).sum())} value(s) <= 0; the "
                             "scorer is broken (retrain it, or resume from an earlier checkpoint)")
    return state


def write_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    """``state`` as fp32 safetensors at ``path``, the same bytes for the same weights."""
    state = {k: v.detach().float().cpu().contiguous() for k, v in state.items()}
    # one metadata key: safetensors writes a metadata map in hash order, so two keys can come out in either
    # order and the same weights would get a different SHA-256 (the hash that quality.json and model cards quote)
    save_file(state, str(path), metadata={"format": "pt"})


def _link_copy(src: Path, dst: Path) -> None:
    """``src`` (a file, a symlink or a directory tree) at ``dst`` as hard links where the filesystem allows, else
    as a copy: an existing scorer directory's other files, carried into its replacement."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, copy_function=link)
    else:
        link(src, dst)


def carry_files(src: Path, dst: Path, skip: tuple[str, ...]) -> None:
    """Every entry of the directory ``src`` (none when it is not one) but those named in ``skip``, into ``dst``:
    :func:`_link_copy`."""
    for entry in src.iterdir() if src.is_dir() else ():
        if entry.name not in skip:
            _link_copy(entry, dst / entry.name)


__all__ = ["carry_files", "read_weights", "write_weights"]
