"""Golden Eviction oracle: block attention vs eager attention, greedy schedule vs a naive loop, golden replay."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from foresight import replay, replay_schedule
from foresight.errors import ForesightError
from foresight.policies import make_policy
from golden.policy import GoldenPolicy
from golden.labels import (EventLabel, LabelMismatchError, TraceLabels, check_labels_match, load_labels, merge_labels,
                           save_labels, token_hash)
from golden.oracle import block_attention, greedy_schedule, label_trace
from tests.conftest import get_model


def _ids(n: int, seed: int = 0, vocab: int = 250) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def naive_block_attention(model, ids: torch.Tensor, pieces) -> torch.Tensor:
    """Eager full attention (output_attentions), averaged over the G heads of each group and block queries."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(ids[None], output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    att = torch.stack([a[0].float() for a in out.attentions])  # (L, Hq, N, N): [query, key]
    num_layers, hq, n, _ = att.shape
    hkv = model.config.num_key_value_heads
    att = att.view(num_layers, hkv, hq // hkv, n, n).mean(2)
    cols = []
    for start, end, _ in pieces:
        cols.append(att[:, :, start:end, :].mean(2))  # mean over the block's queries -> (L, Hkv, N keys)
    return torch.stack(cols, dim=-1)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("budget,interval,n", [(40, 12, 150), (32, 8, 97)])
def test_block_attention_matches_eager(name, budget, interval, n):
    model, _ = get_model(name)
    ids = _ids(n, seed=n)
    abar, pieces = block_attention(model, ids, budget, interval)
    assert pieces == replay_schedule(n, budget, interval)
    ref = naive_block_attention(model, ids, pieces)
    assert abar.shape == ref.shape == (2, 2, n, len(pieces))
    torch.testing.assert_close(abar, ref, atol=2e-6, rtol=1e-5)
    # every query's attention sums to one, so every block column does too
    torch.testing.assert_close(abar.sum(2), torch.ones_like(abar.sum(2)))


def naive_output_error(model, ids: torch.Tensor, pieces) -> torch.Tensor:
    """The ``output`` measure from eager attention and the full cache's values, by plain loops over query heads:
    p/(1 - p) * |v_i - o_q| with o_q = sum_i p_i v_i, averaged over each group's heads and each block's queries."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(ids[None], output_attentions=True, use_cache=True)
    finally:
        model.set_attn_implementation("sdpa")
    hkv = model.config.num_key_value_heads
    per_layer = []
    for layer, att in enumerate(out.attentions):
        p = att[0].double()  # (Hq, N, N)
        v = out.past_key_values.layers[layer].values[0].double()  # (Hkv, N, d)
        g = p.shape[0] // hkv
        err = torch.zeros(hkv, p.shape[1], p.shape[2], dtype=torch.float64)
        for h in range(p.shape[0]):
            vh = v[h // g]
            o = p[h] @ vh  # (N queries, d)
            dist = (vh[None, :, :] - o[:, None, :]).norm(dim=-1)  # (queries, keys)
            err[h // g] += torch.where(p[h] < 1, p[h] / (1 - p[h]).clamp(min=1e-4) * dist, 0.0) / g
        per_layer.append(err)
    err = torch.stack(per_layer)  # (L, Hkv, queries, keys)
    return torch.stack([err[:, :, s:e, :].mean(2) for s, e, _ in pieces], dim=-1).float()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_output_measure_matches_brute_force(name):
    model, _ = get_model(name)
    ids = _ids(97, seed=5)
    abar, pieces = block_attention(model, ids, 32, 8, measure="output", chunk=24)
    ref = naive_output_error(model, ids, pieces)
    assert abar.shape == ref.shape
    torch.testing.assert_close(abar, ref, atol=1e-5, rtol=1e-4)
    att, _ = block_attention(model, ids, 32, 8)
    assert not torch.allclose(abar, att)  # a different measure, so (in general) other labels
    labels = label_trace(model, ids, 32, 8, "t", measure="output")
    assert [e.end for e in labels.events] == [e.end for e in label_trace(model, ids, 32, 8, "t").events]
    with pytest.raises(ValueError, match="unknown oracle measure 'values'"):
        block_attention(model, ids, 32, 8, measure="values")


def test_the_measure_travels_with_the_labels_and_two_oracles_are_not_merged(tiny_llama, tmp_path):
    """Labels of the output-error oracle say so in their file; merged with attention labels (a training run's
    ``labels=[a, b]``, an evaluation's golden sets) they are refused naming both files, not trained on as one
    target. Attention files keep the header they had before (no measure key: identical bytes)."""
    from safetensors import safe_open

    model, _ = tiny_llama
    out_err = label_trace(model, _ids(97, seed=5), 32, 8, "a", measure="output")
    att = label_trace(model, _ids(90, seed=6), 32, 8, "b")
    att_too = label_trace(model, _ids(88, seed=7), 32, 8, "c")
    assert (out_err.measure, att.measure) == ("output", "attention")
    fa, fb, fc = (save_labels(tmp_path / f"{n}.safetensors", [lab]) for n, lab in (("a", out_err), ("b", att),
                                                                                     ("c", att_too)))
    with safe_open(str(fb), framework="pt") as f:
        assert "measure" not in f.metadata()
    read_a, read_b, read_c = load_labels(fa), load_labels(fb), load_labels(fc)
    assert (read_a["a"].measure, read_b["b"].measure) == ("output", "attention")
    assert set(merge_labels([(fb, read_b), (fc, read_c)])) == {"b", "c"}
    with pytest.raises(LabelMismatchError, match=r"b\.safetensors \(measure attention\) and .*a\.safetensors "
                                                 r"\(measure output\) were made by different oracles"):
        merge_labels([(fb, read_b), (fa, read_a)])
    with pytest.raises(ValueError, match="share fingerprint, budget, interval and measure"):
        save_labels(tmp_path / "mixed.safetensors", [out_err, att])


def test_the_cli_offers_every_measure_and_no_other():
    """`foresight golden --measure` spells its choices beside the registry (the CLI imports the oracle lazily):
    a measure added to one and not the other fails here."""
    import argparse

    from foresight.cli import build_parser
    from golden.oracle import MEASURES

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    measure = next(a for a in sub.choices["golden"]._actions if a.dest == "measure")
    assert tuple(measure.choices) == tuple(MEASURES) and measure.default == next(iter(MEASURES))


def test_block_attention_independent_of_chunk(tiny_llama):
    model, _ = tiny_llama
    ids = _ids(120, seed=3)
    a, _ = block_attention(model, ids, 30, 10)
    b, _ = block_attention(model, ids, 30, 10, chunk=7)
    c, _ = block_attention(model, ids, 30, 10, chunk=64)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-5)


def naive_greedy(abar: list[list[float]], pieces, budget: int, interval: int):
    """Plain loops over events and candidates for one head: [(end, candidates, alphas, evicted)]."""
    nb = len(pieces)
    cache: list[int] = []
    events = []
    for s, (start, end, fire) in enumerate(pieces):
        cache += list(range(start, end))
        if not fire:
            continue
        cands, newest = cache[:budget], cache[budget:]
        alphas = []
        for i in cands:
            best = 0.0
            for j in range(s + 1, nb):
                best = max(best, abar[i][j])
            alphas.append(best)
        order = sorted(range(len(cands)), key=lambda c: (alphas[c], c))
        evicted = sorted(cands[c] for c in order[:interval])
        cache = [c for c in cands if c not in evicted] + newest
        events.append((end, cands, alphas, evicted))
    return events


@pytest.mark.parametrize("budget,interval,n", [(20, 5, 120), (37, 8, 150), (16, 15, 64), (24, 8, 32)])
@pytest.mark.parametrize("ties", [False, True])
def test_greedy_schedule_matches_naive(budget, interval, n, ties):
    gen = torch.Generator().manual_seed(budget * 1000 + n)
    pieces = replay_schedule(n, budget, interval)
    shape = (2, 3, n, len(pieces))
    abar = torch.rand(shape, generator=gen)
    if ties:  # few distinct values: exercises the tie-break (older entry evicted first)
        abar = torch.randint(0, 3, shape, generator=gen).float() / 3
    before = abar.clone()
    events = greedy_schedule(abar, pieces, budget, interval)
    assert torch.equal(abar, before), "greedy_schedule must not modify its input unless inplace=True"
    n_events = sum(f for *_, f in pieces)
    assert len(events) == n_events
    for layer in range(2):
        for head in range(3):
            ref = naive_greedy(abar[layer, head].tolist(), pieces, budget, interval)
            assert len(ref) == n_events
            for ev, (end, cands, alphas, evicted) in zip(events, ref):
                assert ev.end == end
                assert ev.candidates[layer, head].tolist() == cands
                assert ev.evicted[layer, head].tolist() == evicted
                torch.testing.assert_close(ev.alpha[layer, head], torch.tensor(alphas), atol=0, rtol=0)
    assert greedy_schedule(abar.clone(), pieces, budget, interval, inplace=True)[-1].evicted.equal(events[-1].evicted)


def test_greedy_schedule_rejects_wrong_blocks():
    pieces = replay_schedule(50, 20, 5)
    with pytest.raises(ValueError, match="blocks"):
        greedy_schedule(torch.rand(1, 1, 50, len(pieces) + 1), pieces, 20, 5)


@dataclass
class _RecordingGolden(GoldenPolicy):
    """Golden replay that also records the cache content (positions) each step sees before its new tokens."""

    observes: ClassVar[bool] = True

    def reset(self, batch_size, num_layers, device, **meta):
        super().reset(batch_size, num_layers, device, **meta)
        self.seen: dict[tuple[int, int], torch.Tensor] = {}

    def observe(self, view):
        q = view.query.shape[2]
        start = int(view.query_positions[0, 0])
        self.seen[(view.layer_idx, start)] = view.positions[:, :, :-q].clone()


def test_golden_replay_evicts_exactly_the_labels(tiny_llama):
    model, _ = tiny_llama
    budget, interval = 40, 12
    seqs = [_ids(150, seed=1).tolist(), _ids(118, seed=2).tolist()]
    labels = [label_trace(model, s, budget, interval, trace_id=f"t{i}") for i, s in enumerate(seqs)]
    assert [len(lab.events) for lab in labels] == [sum(f for *_, f in replay_schedule(len(s), budget, interval)) for s in seqs]
    policy = _RecordingGolden(labels=labels)
    res = replay(model, seqs, policy=policy, budget=budget, interval=interval, trace_ids=["t0", "t1"])
    checked = 0
    for b, lab in enumerate(labels):
        for ev in lab.events:
            if ev.end >= len(seqs[b]):
                continue  # nothing is fed after the trace's last event
            for layer in range(2):
                cand, evicted = ev.candidates[layer], ev.evicted[layer]
                assert evicted.shape == (2, interval) and cand.shape == (2, budget)
                kept = [sorted(set(cand[h].tolist()) - set(evicted[h].tolist())) for h in range(2)]
                expected = torch.tensor([k + list(range(ev.end - interval, ev.end)) for k in kept])
                assert torch.equal(policy.seen[(layer, ev.end)][b], expected)
                checked += 1
    assert checked >= 10
    full = replay(model, seqs, policy="full")
    tail = slice(budget + interval, None)
    assert not torch.allclose(res.ce[0, tail], full.ce[0, tail]), "golden replay should differ from the full cache"


def test_golden_policy_scores_are_alpha(tiny_llama):
    model, _ = tiny_llama
    seq = _ids(100, seed=5).tolist()
    lab = label_trace(model, seq, 30, 10, trace_id="x")
    ev = lab.events[0]
    captured = {}

    @dataclass
    class Capture(GoldenPolicy):
        def score(self, view):
            s = super().score(view)
            captured.setdefault((view.event, view.layer_idx), s.clone())
            return s

    replay(model, [seq], policy=Capture(labels={"x": lab}), budget=30, interval=10, trace_ids=["x"])
    s = captured[(0, 1)][0]
    is_ev = (ev.candidates[1][:, :, None] == ev.evicted[1][:, None, :]).any(-1)  # per KV head
    assert is_ev.sum(-1).tolist() == [10, 10]
    assert torch.equal(ev.evicted_mask(1), is_ev) and torch.equal(ev.evicted_mask()[1], is_ev)
    assert torch.isinf(s[is_ev]).all() and (s[is_ev] < 0).all()
    torch.testing.assert_close(s[~is_ev], ev.alpha[1][~is_ev])


def test_labels_roundtrip_and_checks(tmp_path, tiny_llama):
    model, _ = tiny_llama
    labs = [label_trace(model, _ids(90, seed=s).tolist(), 30, 10, trace_id=f"p{s}#0") for s in range(2)]
    path = save_labels(tmp_path / "l.safetensors", labs)
    loaded = load_labels(path)
    assert list(loaded) == ["p0#0", "p1#0"]
    for lab in labs:
        got = loaded[lab.trace_id]
        assert (got.budget, got.interval, got.fingerprint) == (30, 10, lab.fingerprint)
        for a, b in zip(got.events, lab.events):
            assert a.end == b.end and a.candidates.dtype == torch.long
            assert torch.equal(a.candidates, b.candidates) and torch.equal(a.evicted, b.evicted)
            assert torch.equal(a.alpha, b.alpha)
    check_labels_match(loaded, model, 30, 10)
    with pytest.raises(LabelMismatchError, match="B=30, W=10"):
        check_labels_match(loaded, model, 30, 8)
    other, _ = get_model("tiny-qwen3")
    with pytest.raises(LabelMismatchError, match="tiny-llama"):
        check_labels_match(loaded, other, 30, 10)


def test_label_files_are_byte_identical_between_identical_runs(tmp_path, tiny_llama):
    """safetensors keeps a file's metadata in a Rust HashMap, whose key order differs from one write to the next:
    the same labels gave shards of different bytes (so other SHA-256s in the manifests and another labels_digest).
    The header's keys are written sorted (tests/safety/test_safetensors_file.py); the labels read back the same, and a file
    written in any key order (the shards of earlier runs) still loads."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from golden.labels import FORMAT

    model, _ = tiny_llama
    labs = [label_trace(model, _ids(90, seed=s).tolist(), 30, 10, trace_id=f"p{s}#0") for s in range(2)]
    flipped = [dataclasses.replace(lab, fingerprint=dict(reversed(list(lab.fingerprint.items()))))
               for lab in labs]  # the same content, built in another order
    assert list(flipped[0].fingerprint) != list(labs[0].fingerprint)
    written = {save_labels(tmp_path / f"l{i}.safetensors", labs if i % 2 else flipped).read_bytes() for i in range(6)}
    assert len(written) == 1
    with safe_open(str(tmp_path / "l0.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == FORMAT and json.loads(meta["trace_ids"]) == ["p0#0", "p1#0"]
    # a shard written the old way (the metadata in safetensors' order) loads as before
    old = tmp_path / "old.safetensors"
    with safe_open(str(tmp_path / "l1.safetensors"), framework="pt") as f:
        save_file({k: f.get_tensor(k) for k in f.keys()}, str(old), metadata=dict(reversed(list(f.metadata().items()))))
    a, b = load_labels(old), load_labels(tmp_path / "l1.safetensors")
    assert list(a) == list(b) == ["p0#0", "p1#0"]
    for t in a:
        assert (a[t].fingerprint, a[t].token_hash) == (b[t].fingerprint, b[t].token_hash) == \
            (labs[int(t[1])].fingerprint, labs[int(t[1])].token_hash)
        assert all(torch.equal(x.alpha, y.alpha) and torch.equal(x.candidates, y.candidates)
                   for x, y in zip(a[t].events, b[t].events))


def test_golden_policy_errors(tiny_llama):
    model, _ = tiny_llama
    seq = _ids(90, seed=7).tolist()
    lab = label_trace(model, seq, 30, 10, trace_id="a")
    with pytest.raises(ValueError, match="labels"):
        make_policy("golden")
    with pytest.raises(ForesightError, match="trace_ids"):
        replay(model, [seq], policy=make_policy("golden", labels=[lab]), budget=30, interval=10)
    with pytest.raises(ForesightError, match="no golden labels"):
        replay(model, [seq], policy=make_policy("golden", labels=[lab]), budget=30, interval=10, trace_ids=["b"])
    with pytest.raises(LabelMismatchError, match="B=30 W=10"):
        replay(model, [seq], policy=make_policy("golden", labels=[lab]), budget=40, interval=10, trace_ids=["a"])
    other = _ids(90, seed=8).tolist()
    wrong = TraceLabels("a", 30, 10, lab.fingerprint, [EventLabel(e.end, e.candidates + 1, e.alpha, e.evicted) for e in lab.events],
                        token_hash=token_hash(other))  # right tokens, wrong events: caught at the first event
    with pytest.raises(ForesightError, match="do not match"):
        replay(model, [other], policy=make_policy("golden", labels=[wrong]), budget=30, interval=10, trace_ids=["a"])
    assert make_policy("golden", labels=[lab]).replay_only
