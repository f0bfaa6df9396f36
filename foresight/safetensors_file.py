"""Safetensors files with reproducible bytes: the same tensors and metadata give the same file in every process."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from safetensors.torch import save_file

from foresight.atomic import atomic_file


def save_safetensors(tensors: dict, path: str | Path, metadata: dict[str, str]) -> Path:
    """``safetensors.torch.save_file`` with the header's ``__metadata__`` in sorted key order, so the same tensors and
    metadata give the same bytes in every process: safetensors keeps the metadata in a Rust ``HashMap``, whose
    order differs from one process to the next, so two identical runs wrote shards with different SHA-256s (and
    different recorded digests). Only the header's key order changes: readers see the same metadata, and files
    written before (in any order) read as they did."""
    path = Path(path)
    save_file(tensors, str(path), metadata=metadata)
    with path.open("r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        if meta is None:
            return path
        text = json.dumps({"__metadata__": dict(sorted(meta.items())), **header}, separators=(",", ":"),
                          ensure_ascii=False).encode()
        if len(text) <= n:  # the same JSON in another key order: as long (padded with spaces, as safetensors does)
            f.seek(8)
            f.write(text + b" " * (n - len(text)))
            return path
        # written with other escapes than json.dumps's: rewrite the file with the new header (8-byte aligned)
        text += b" " * (-(8 + len(text)) % 8)
        with atomic_file(path) as tmp, tmp.open("wb") as g:
            g.write(struct.pack("<Q", len(text)) + text)
            f.seek(8 + n)
            shutil.copyfileobj(f, g)
    return path
