"""foresight.safetensors_file: the same tensors and metadata give the same bytes whatever the metadata's order."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

import foresight.safetensors_file
from foresight.safetensors_file import save_safetensors


def test_the_header_keys_are_sorted_so_identical_writes_give_identical_bytes(tmp_path, monkeypatch):
    """safetensors keeps the metadata in a Rust HashMap, whose key order differs from one write to the next; the
    header is rewritten with its keys sorted, in place, or (a longer header) as a whole new file, atomically."""
    tensors = {"b": torch.arange(6.0), "a": torch.ones(2, 3, dtype=torch.int32)}
    keys = {"trace_ids": '["x#0"]', "format": "f", "budget": "64", "ünïcode": 'a "quoted" \\ \n value'}
    orders = [keys, dict(reversed(list(keys.items())))]
    written = {save_safetensors(tensors, tmp_path / f"s{i}.safetensors", orders[i % 2]).read_bytes()
               for i in range(6)}
    assert len(written) == 1
    (data,) = written
    assert (8 + int.from_bytes(data[:8], "little")) % 8 == 0  # the tensor data stays 8-byte aligned
    with safe_open(str(tmp_path / "s0.safetensors"), framework="pt") as f:
        assert f.metadata() == keys and torch.equal(f.get_tensor("b"), tensors["b"])
        assert torch.equal(f.get_tensor("a"), tensors["a"])

    # a header that comes out longer than safetensors' (other escapes): the file is rewritten whole, still aligned
    class Wider:
        loads = staticmethod(json.loads)

        @staticmethod
        def dumps(obj, **kw):
            return json.dumps(obj, **{**kw, "separators": (", ", ": ")})

    monkeypatch.setattr(foresight.safetensors_file, "json", Wider)
    wide = save_safetensors(tensors, tmp_path / "wide.safetensors", orders[1]).read_bytes()
    assert len(wide) > len(data) and (8 + int.from_bytes(wide[:8], "little")) % 8 == 0
    assert b'"__metadata__": {"budget": "64", "format": "f", "trace_ids"' in wide
    with safe_open(str(tmp_path / "wide.safetensors"), framework="pt") as f:
        assert f.metadata() == keys and torch.equal(f.get_tensor("b"), tensors["b"])
    assert [q.name for q in tmp_path.iterdir() if q.name.startswith(".")] == []  # no temporary left
