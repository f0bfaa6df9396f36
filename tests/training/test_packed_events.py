"""The packed layout of recorded events (training/packed_events.py): per-entry columns once per trace, per-event
columns per event. Read back, it must equal the dense features recorded by the replay for every event and every
column selection; a trace whose per-entry columns change between events is refused; files and rows of the earlier
dense layout are repacked (no replay) into the same features."""

from __future__ import annotations

import datasets
import pytest
import torch
from safetensors.torch import save_file

import foresight
from foresight.errors import ForesightError
from foresight.features import FEATURE_GROUPS, FeatureExtractor, feature_columns, feature_dim
from golden.labels import load_labels
from tests.training.test_dagger import _cfg, _make_data
from training.mapped_events import EventRows
from training.packed_events import PACKED_LAYOUT, PackedPart, pack

B, W = 16, 4
ALL = tuple(FEATURE_GROUPS)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _make_data(tmp_path_factory.mktemp("packed_data"), n=4)


@pytest.fixture(scope="module")
def recorded(data):
    """Dense events (every group, fp16) recorded along the golden trajectories of a tiny Llama."""
    from training.sl_features import collect_events

    model, _ = foresight.load_model("tiny-llama", device="cpu")
    labels = load_labels(data[1])
    rows = list(datasets.load_from_disk(str(data[0])))
    evs = collect_events(model, [r["input_ids"] for r in rows], [r["trace_id"] for r in rows], labels,
                         lambda: FeatureExtractor(window=W, feature_set=ALL), B, W, torch.float16, 2)
    fp = foresight.model_fingerprint(model)
    return evs, fp["head_dim"], fp["num_heads"] // fp["num_kv_heads"]


def _columns(sets, d, g):
    return [None] + [torch.tensor(feature_columns(s, ALL, d, g)) for s in sets]


def test_packed_events_read_back_as_the_recorded_features(recorded):
    evs, d, g = recorded
    assert all(e.features.shape[0] > 2 for e in evs)  # entries recorded at several events: something to share
    packed = [PackedPart(pack(e.features, e.positions, d, g), e.positions, d, g) for e in evs]
    dense = [e.features for e in evs]
    sets = [("prekey", "value", "attn", "age"), ("attn", "key"), ("age",), ("value",), ("recency", "prekey", "key")]
    width = feature_dim(ALL, d, g)
    gen = torch.Generator().manual_seed(3)
    odd = [torch.randperm(width, generator=gen)[:40], torch.arange(width).flip(0),  # parts of groups, any order
           torch.tensor([d + 1, d + 2, 0, 1, width - 1, d])]
    for cols in _columns(sets, d, g) + odd:
        got, ref = EventRows(packed, cols), EventRows(dense, cols)
        assert got.shape == ref.shape
        idx = torch.randperm(len(ref), generator=torch.Generator().manual_seed(0))
        assert torch.equal(got[idx], ref[idx]) and torch.equal(got[:], ref[:])  # bit for bit, any order
    # and the packed tensors are smaller than the dense ones
    for p, e in zip(packed, evs):
        size = sum(t.numel() for t in [*p.static.values(), p.dynamic]) * 2
        assert size < e.features.numel() * 2


@pytest.mark.parametrize("groups", [("value", "attn", "age", "prekey"), ("attn",), ("key", "recency", "query")])
def test_a_file_of_some_groups_reads_their_columns_as_a_file_of_every_group(data, recorded, tmp_path, groups):
    """DAgger's rows hold only the scorer's groups: saved and read back, their columns (addressed as those of the full
    feature vector) equal the full file's bit for bit; a column of a group they lack is refused, naming it."""
    from training.event_files import RecordedEvents, concat_events, events_bytes, load_events, save_events
    from training.onpolicy import ROWS_FORMAT
    from training.packed_events import recorded_groups

    evs, d, g = recorded
    ev = evs[1]
    sub = recorded_groups(groups)
    assert sub == tuple(x for x in ALL if x in groups)
    dense = ev.features[..., feature_columns(sub, ALL, d, g)]  # what an extractor of those groups records
    path = tmp_path / "sub.safetensors"
    save_events(path, RecordedEvents(ev.trace_id, dense, ev.alpha, ev.evicted, ev.positions), d, g, ROWS_FORMAT,
                groups=sub)
    back = load_events(path, ROWS_FORMAT)
    assert back.features.groups == sub
    cols = torch.tensor(feature_columns(groups, ALL, d, g))
    full = EventRows([ev.features], cols)
    assert torch.equal(EventRows([back.features], cols)[:], full[:])
    assert torch.equal(concat_events([back], cols)["features"][:], full[:])
    raw = path.read_bytes()  # the estimate before recording is the bytes written
    need = events_bytes(load_labels(data[1])[ev.trace_id], d, g, torch.float16, sub)
    assert len(raw) - 8 - int.from_bytes(raw[:8], "little") == need
    assert need < events_bytes(load_labels(data[1])[ev.trace_id], d, g, torch.float16)
    lacking = next(x for x in ALL if x not in sub)
    with pytest.raises(ForesightError, match=rf"trace '{ev.trace_id}' lack .*holds the feature groups "
                                             rf"{', '.join(sub)}, not {lacking}"):
        concat_events([back], torch.tensor(feature_columns((lacking,), ALL, d, g)))
    with pytest.raises(ForesightError, match="must be in the order"):
        pack(dense, ev.positions, d, g, tuple(reversed(sub)) if len(sub) > 1 else ("age", "key"))


def test_an_entry_whose_static_columns_change_between_events_is_refused(recorded):
    evs, d, g = recorded
    ev = evs[0]
    key = feature_columns(("value",), ALL, d, g)
    feats = ev.features.clone()
    # an entry recorded at events 0 and 1 (it survived event 0): change its value at event 1 only
    p0 = ev.positions[0, 0, 0]
    p1 = ev.positions[1, 0, 0]
    c1 = int((p1[:, None] == p0[None, :]).any(1).nonzero()[0])
    feats[1, 0, 0, c1, key[0]] += 1
    with pytest.raises(ForesightError, match="'value' differs between two events of one cache entry"):
        pack(feats, ev.positions, d, g)
    with pytest.raises(ForesightError, match="cannot pack features"):
        pack(ev.features[..., :-1], ev.positions, d, g)


def test_dense_feature_files_and_rows_are_repacked_without_a_replay(data, tmp_path, monkeypatch):
    """A feature cache and DAgger rows written in the dense layout of earlier versions are rewritten packed, with
    the same features, and training ends where a run on freshly packed files ends."""
    from training import dagger, sl_features
    from training.dagger import rows_file
    from training.event_files import load_events, saved_metadata
    from training.onpolicy import ROWS_FORMAT
    from training.sl import run_sl
    from training.sl_features import FEATURE_CACHE_FORMAT

    def fmt(f):
        return ROWS_FORMAT if f in row_files else FEATURE_CACHE_FORMAT

    ref = run_sl(_cfg(data, tmp_path / "ref" / "run", dagger_rounds=1, dagger_beta=0.0, steps=4))
    out = tmp_path / "old" / "run"
    old = dict(dagger_rounds=1, dagger_beta=0.0, steps=4, feature_cache_groups="all")  # dense caches held all
    with monkeypatch.context() as m:  # earlier versions' rows held every feature group, as the feature cache did
        m.setattr(dagger, "_groups", lambda cfg: ALL)
        first = run_sl(_cfg(data, out, **old))
    cache_files = sorted((out.parent / "features").glob("*/*.safetensors"))
    row_files = sorted(rows_file(out, 1, "x").parent.glob("*.safetensors"))
    assert cache_files and row_files
    dense = {}
    for f in cache_files + row_files:  # rewrite each file as earlier versions wrote it: dense, no layout
        ev = load_events(f, fmt(f))
        x = EventRows([ev.features])[:]
        dense[f] = x
        meta = {"format": ROWS_FORMAT, "trace_id": ev.trace_id} if f in row_files else \
            {"format": FEATURE_CACHE_FORMAT, "trace_id": ev.trace_id, "identity": saved_metadata(f)["identity"]}
        save_file({"features": x.contiguous(), "alpha": ev.alpha.contiguous(),
                   "evicted": ev.evicted.to(torch.uint8).contiguous(), "positions": ev.positions.contiguous()},
                  str(f), metadata=meta)
        assert "layout" not in saved_metadata(f)
    # what the dense files hold reads back as it did, in the old layout too
    assert torch.equal(EventRows([load_events(cache_files[0], FEATURE_CACHE_FORMAT).features])[:],
                       dense[cache_files[0]])
    # a file of one kind is never read as the other
    with pytest.raises(ForesightError, match=r"is not a foresight-sl-features/2 file \(its format is "
                                             r"'foresight-dagger-rows/1'\); pass a file or directory of that kind$"):
        load_events(row_files[0], FEATURE_CACHE_FORMAT)  # and no advice to delete a good file of the other kind

    def no_replay(*a, **k):
        raise AssertionError("a dense file with an up-to-date identity must be repacked, not replayed")

    monkeypatch.setattr(sl_features, "collect_events", no_replay)
    monkeypatch.setattr(dagger, "collect_onpolicy_events", no_replay)
    (out / "rounds" / "round-1" / "summary.json").unlink()  # round 1 open again: its rows are reused
    again = run_sl(_cfg(data, out, **old), resume=True)
    for f, x in dense.items():
        meta = saved_metadata(f)
        assert meta["layout"] == PACKED_LAYOUT and meta["format"] == fmt(f), f
        assert (meta.get("identity") is None) == (f in row_files), f  # the writer's metadata survives the repack
        ev = load_events(f, fmt(f))
        assert torch.equal(EventRows([ev.features])[:], x), f
    assert again["eval"]["overlap"] == first["eval"]["overlap"] == ref["eval"]["overlap"]
    assert again["eval"]["auc"] == ref["eval"]["auc"]


def test_the_layout_keeps_every_column_of_the_full_feature_vector(recorded):
    _, d, g = recorded
    from training.packed_events import DYNAMIC_GROUPS, _layout

    static, dynamic = _layout(d, g)
    cols = sorted([c for cs in static.values() for c in cs] + dynamic)
    assert cols == list(range(feature_dim(ALL, d, g)))  # every column once, in exactly one place
    assert DYNAMIC_GROUPS and set(DYNAMIC_GROUPS) | set(static) == set(ALL)


def test_saved_event_files_are_byte_identical_between_identical_writes(recorded, tmp_path):
    """safetensors keeps the metadata in a Rust HashMap whose order changes from one write to the next: the same
    events written twice (a feature cache, DAgger's rows) must give the same bytes, the header's keys sorted."""
    import json
    import struct

    from training.event_files import read_events, save_events
    from training.onpolicy import ROWS_FORMAT

    evs, d, g = recorded
    meta = {"fingerprint": "{}", "budget": "16", "zeta": "z", "alpha_key": "a"}
    written = set()
    for i in range(6):
        path = tmp_path / f"{i}.safetensors"
        save_events(path, evs[0], d, g, ROWS_FORMAT, dict(reversed(list(meta.items()))) if i % 2 else meta)
        written.add(path.read_bytes())
    assert len(written) == 1
    (data,) = written
    (n,) = struct.unpack("<Q", data[:8])
    keys = list(json.loads(data[8:8 + n])["__metadata__"])
    assert keys == sorted(keys) and {"format", "trace_id", "layout", *meta} <= set(keys)
    got, ev = read_events(tmp_path / "0.safetensors", ROWS_FORMAT)
    assert {k: got[k] for k in meta} == meta and got["trace_id"] == evs[0].trace_id
    assert torch.equal(EventRows([ev.features])[:], evs[0].features)
    assert [q.name for q in tmp_path.iterdir() if q.name.startswith(".")] == []


def test_read_targets_stay_mapped_and_read_like_their_concatenation(recorded, tmp_path):
    """α, evict flags and positions are read in place like the features: a clone per trace, concatenated again per
    rank, held 12 GB per rank at 60k events of a third DAgger round. Every target of a read file is a view of that
    file's mapping, through concat_events and join_events; indexing and the digest equal the concatenation's."""
    from training.digests import digest
    from training.event_files import TARGETS, concat_events, join_events, read_events, save_events
    from training.onpolicy import ROWS_FORMAT

    evs, d, g = recorded
    paths = []
    for i, ev in enumerate(evs):
        paths.append(tmp_path / f"{i}.safetensors")
        save_events(paths[-1], ev, d, g, ROWS_FORMAT)
    read = [read_events(p, ROWS_FORMAT)[1] for p in paths]
    for p, ev in zip(paths, read):
        for name in TARGETS:  # a view of the whole mapped file, not a copy of the tensor
            assert getattr(ev, name).untyped_storage().nbytes() == p.stat().st_size, name
    cols = torch.tensor(feature_columns(("attn", "key"), ALL, d, g))
    both = join_events([concat_events(read[:1], cols), concat_events(read[1:], cols)])
    for name in TARGETS:
        ref = torch.cat([getattr(e, name) for e in evs]).to(getattr(read[0], name).dtype)
        rows = both[name]
        assert all(part.features.untyped_storage().nbytes() == p.stat().st_size
                   for part, p in zip(rows.parts, paths)), name
        idx = torch.randperm(len(ref), generator=torch.Generator().manual_seed(1))
        assert rows.shape == ref.shape and torch.equal(rows[idx], ref[idx]), name
        assert digest([rows]) == digest([ref]), name  # a resume identity recorded before this change still holds
    assert torch.equal(both["features"][:], torch.cat([e.features for e in evs]).index_select(-1, cols))
    with pytest.raises(ValueError, match="only dense parts"):
        digest([both["features"]])
    # evict flags other than 0/1 bytes (a damaged file) are refused, not viewed as bools
    from safetensors.torch import load_file

    tensors = load_file(str(paths[0]))
    tensors["evicted"] = tensors["evicted"].clone()
    tensors["evicted"].view(-1)[0] = 2
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata=read_events(paths[0], ROWS_FORMAT)[0])
    with pytest.raises(ForesightError, match=r"bad.safetensors is not a readable .*evict flags are not 0/1 bytes"):
        read_events(bad, ROWS_FORMAT)
