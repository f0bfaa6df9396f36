"""Event features read in place (training/mapped_events.py): the mapped tensors equal safetensors' own loader, and
EventRows addresses per-trace parts exactly like their concatenation."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from training.mapped_events import EventRows, map_safetensors


def test_mapped_tensors_equal_the_safetensors_loader(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {"features": torch.randn(3, 2, 5, 7, generator=gen).half(), "alpha": torch.rand(3, 2, 5, generator=gen),
               "evicted": (torch.rand(3, 2, 5, generator=gen) > 0.5).to(torch.uint8),
               "positions": torch.randint(0, 99, (3, 2, 5), generator=gen, dtype=torch.int32)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path), metadata={"trace_id": "p0#0"})
    meta, mapped = map_safetensors(path)
    ref = load_file(str(path))
    assert meta == {"trace_id": "p0#0"} and set(mapped) == set(ref)
    for name, t in ref.items():
        assert mapped[name].dtype == t.dtype and torch.equal(mapped[name], t)


def test_a_truncated_or_foreign_file_is_an_error(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"features": torch.zeros(4, 8)}, str(path))
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="bad dtype, shape or offsets"):
        map_safetensors(tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="header length"):
        map_safetensors(tmp_path / "junk.safetensors")


def test_event_features_index_like_the_concatenation():
    gen = torch.Generator().manual_seed(1)
    parts = [torch.randn(n, 2, 3, 4, 6, generator=gen) for n in (3, 0, 5, 1)]
    cols = torch.tensor([5, 0, 2])
    ev = EventRows(parts, cols)
    ref = torch.cat(parts).index_select(-1, cols)
    assert ev.shape == ref.shape and len(ev) == 9
    idx = torch.tensor([8, 0, 3, 2, 7, 3])
    assert torch.equal(ev[idx], ref[idx])
    assert torch.equal(ev[2:6], ref[2:6]) and torch.equal(ev[:], ref) and torch.equal(ev[-1], ref[-1:])
    with pytest.raises(IndexError):
        ev[torch.tensor([9])]
    both = EventRows.cat([ev, EventRows(parts[:1], cols)])
    assert torch.equal(both[:], torch.cat([ref, ref[:3]]))
    with pytest.raises(ValueError, match="column selections differ"):
        EventRows.cat([ev, EventRows(parts[:1], None)])
    with pytest.raises(ValueError, match="event shapes differ"):
        EventRows([parts[0], torch.zeros(2, 2, 3, 4, 7)])
