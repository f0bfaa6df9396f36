"""Content digests: the identity of traces, labels and scorers that a ``--resume`` must find unchanged.

One rule for every trainer: sha256 over the parts in order, each part encoded by type and followed by a NUL, the
first 16 hex digits kept. Tensors contribute dtype, shape and bytes; int lists their int64 bytes; an
:class:`~training.mapped_events.EventRows` of dense parts contributes what the tensor of its concatenation would,
part by part (it is never concatenated in memory).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from training.mapped_events import EventRows


def digest(parts: Iterable[Any]) -> str:
    """sha256 (first 16 hex digits) over strings, bytes, int lists and tensors, in order."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, (torch.Tensor, EventRows)):
            h.update(f"{p.dtype}{tuple(p.shape)}".encode())
            for t in p.dense_parts() if isinstance(p, EventRows) else [p]:
                t = t.detach().cpu().contiguous()
                h.update(t.view(torch.uint8).numpy() if t.numel() else b"")
        elif isinstance(p, (bytes, bytearray)):
            h.update(p)
        elif isinstance(p, (list, tuple)):
            h.update(np.asarray(p, dtype=np.int64).tobytes())
        else:
            h.update(str(p).encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def digest_rows(rows: list[dict]) -> str:
    """Identity of trace rows: their ids and token ids, in order."""
    return digest(x for r in rows for x in (r["trace_id"], list(map(int, r["input_ids"]))))


def digest_files(paths: Iterable[str | Path]) -> str:
    """Identity of files by content (e.g. a scorer directory's config.json + model.safetensors)."""
    return digest(x for p in paths for x in (Path(p).name, Path(p).read_bytes()))
