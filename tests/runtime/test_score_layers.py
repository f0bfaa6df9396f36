"""A policy that scores every layer of an event at once (``scores_layers``: the ``learned`` policy under top-k) keeps
exactly the entries it keeps layer by layer: the same kept indices at every layer and event, features to fp32
rounding and the same statistics afterwards; in chunks of layers as in one; by hand on a 4-layer cache (decode, a
long prompt, a left-padded batch, a multi-token forward) and end to end on the tiny models."""

from __future__ import annotations

import copy

import pytest
import torch

import foresight
from foresight.features import FeatureExtractor
from foresight.feature_groups import FEATURE_GROUPS
from foresight.cache import EVENT_BYTES
from foresight.errors import ForesightError
from foresight.policies.learned import LearnedPolicy
from foresight.scorer import Scorer, ScorerConfig
from foresight.views import EvictLayersView, StepView
from tests.conftest import TINY, get_model
from tests.runtime.test_observe_layers import CASE_IDS, CASES, FINGERPRINT, drive_by_hand

ALL_GROUPS = tuple(FEATURE_GROUPS)
#: The groups a cache driven by hand can build (the others undo RoPE, which needs a model's rotary embedding).
BY_HAND = ("key", "value", "attn", "age", "recency")


class PerLayerLearned(LearnedPolicy):
    """``learned`` asked layer by layer (``score``/``select``/``on_evict`` per layer), the reference."""

    @property
    def scores_layers(self) -> bool:
        return False


def build(cls, fingerprint: dict, budget: int = 24, interval: int = 8, groups=BY_HAND, **kwargs):
    cfg = ScorerConfig(fingerprint=fingerprint, budget=budget, interval=interval, feature_set=groups)
    return cls(scorer=Scorer(cfg, seed=0), **kwargs)


class Counter:
    """How often the cache asked ``policy`` for all layers at once, and every kept index it handed over."""

    def __init__(self, policy):
        self.calls, self.keeps = 0, []
        score_layers, on_evict, on_evict_layers = policy.score_layers, policy.on_evict, policy.on_evict_layers

        def rec_score_layers(view):
            self.calls += 1
            return score_layers(view)

        def rec_on_evict(layer_idx, keep):
            self.keeps.append((layer_idx, keep.clone()))
            on_evict(layer_idx, keep)

        def rec_on_evict_layers(layers, keep):
            self.keeps.extend((layer, k.clone()) for layer, k in zip(layers, keep))
            on_evict_layers(layers, keep)

        policy.score_layers, policy.on_evict, policy.on_evict_layers = (rec_score_layers, rec_on_evict,
                                                                         rec_on_evict_layers)


def assert_same_state(a: FeatureExtractor, b: FeatureExtractor) -> None:
    for x, y in zip(a._layers, b._layers):
        assert (x.n, x.head, x.filled) == (y.n, y.head, y.filled)
        for name in ("cum", "dec"):
            torch.testing.assert_close(getattr(x, name), getattr(y, name), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(x.rows[..., : x.n], y.rows[..., : y.n], rtol=0, atol=0)
        torch.testing.assert_close(x.seen[..., : x.n], y.seen[..., : y.n], rtol=0, atol=0)


@pytest.mark.parametrize("spread", [0.0, 0.02])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_all_layers_at_once_keeps_what_layer_by_layer_keeps(case, spread):
    runs = {}
    for cls in (PerLayerLearned, LearnedPolicy):
        policy = build(cls, FINGERPRINT, spread=spread)
        runs[cls] = (Counter(policy), drive_by_hand(policy, **case), policy)
    (ref, ref_cache, ref_pol), (got, got_cache, got_pol) = runs[PerLayerLearned], runs[LearnedPolicy]
    assert ref.calls == 0 and got.calls == got_cache.events == ref_cache.events > 2
    assert [layer for layer, _ in got.keeps] == [layer for layer, _ in ref.keeps]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(got.keeps, ref.keeps))
    assert all(torch.equal(x.positions, y.positions) for x, y in zip(got_cache.layers, ref_cache.layers))
    assert_same_state(got_pol.extractor, ref_pol.extractor)


def test_chunks_of_layers_keep_what_one_chunk_keeps(monkeypatch):
    runs = {}
    for event_bytes in (EVENT_BYTES, 1):  # 1 byte: one layer per chunk
        monkeypatch.setattr("foresight.cache.EVENT_BYTES", event_bytes)
        policy = build(LearnedPolicy, FINGERPRINT, spread=0.02)
        runs[event_bytes] = (Counter(policy), drive_by_hand(policy, steps=60, prompt=5))
    (whole, cache), (chunked, _) = runs[EVENT_BYTES], runs[1]
    assert whole.calls == cache.events > 2 and chunked.calls == cache.events * len(cache.layers)
    assert len(whole.keeps) == len(chunked.keeps) > 0
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(whole.keeps, chunked.keeps))


def test_sampled_selection_is_asked_layer_by_layer():
    """Each layer draws from its own generator: ``sample`` never takes the all-layers path."""
    assert not build(LearnedPolicy, FINGERPRINT, selection="sample").scores_layers
    assert build(LearnedPolicy, FINGERPRINT).scores_layers
    assert not build(LearnedPolicy, FINGERPRINT, on_features=lambda view, feats: None).scores_layers


def _observe(ext: FeatureExtractor, layer: int, n: int, q: int, gen: torch.Generator, start: int) -> None:
    b, hq, hkv, d = 2, 4, 2, 8
    keys = torch.randn(b, hkv, n, d, generator=gen)
    pos = torch.arange(n)[None, None].expand(b, hkv, n)
    ext.observe(StepView(layer_idx=layer, query=torch.randn(b, hq, q, d, generator=gen), keys=keys,
                         values=torch.randn(b, hkv, n, d, generator=gen), positions=pos,
                         valid=torch.ones(b, hkv, n, dtype=torch.bool),
                         query_positions=torch.arange(start, start + q)[None].expand(b, q), mask=None, step=0))


@pytest.mark.parametrize("in_step", [True, False], ids=["layers in step", "layers out of step"])
def test_extractor_features_of_all_layers_equal_each_layers(in_step):
    """By hand, on the extractor alone: features and state after an eviction, all layers at once against one
    by one; layers out of step (one observed a query more) are taken one by one."""
    num_layers, n, c, keep_n = 3, 20, 12, 8
    gen = torch.Generator().manual_seed(0)
    ext = FeatureExtractor(window=8, feature_set=ALL_GROUPS)
    ext.reset(num_layers, num_groups=2)
    for layer in range(num_layers):
        _observe(ext, layer, n, 3, gen, 0)
    if not in_step:
        _observe(ext, 1, n, 1, gen, 3)
    ref = copy.deepcopy(ext)
    keys = torch.randn(num_layers, 2, 2, n, 8, generator=gen)
    view = EvictLayersView(layers=range(num_layers), keys=keys, values=torch.randn_like(keys),
                           positions=torch.arange(n)[None, None, None].expand(num_layers, 2, 2, n).contiguous(),
                           valid=torch.ones(num_layers, 2, 2, n, dtype=torch.bool), num_candidates=c,
                           num_keep=keep_n, event=0, step=1, rope=(torch.ones(4), 1.0))
    got = ext.features_layers(view)
    want = torch.stack([ref.features(view.layer(i)) for i in range(num_layers)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    keep = torch.stack([torch.randperm(n, generator=gen)[:keep_n].sort().values for _ in range(num_layers * 4)])
    keep = keep.view(num_layers, 2, 2, keep_n)
    ext.on_evict_layers(view.layers, keep)
    for i in range(num_layers):
        ref.on_evict(i, keep[i])
    assert_same_state(ext, ref)


@pytest.mark.parametrize("model_name", TINY)
@pytest.mark.parametrize("kept", [{}, {"sinks": 2, "protect_prompt": True}], ids=["plain", "sinks, protected prompt"])
def test_generation_is_the_same_either_way(model_name, kept):
    model, tok = get_model(model_name)
    fp = foresight.model_fingerprint(model)
    out = {}
    for cls in (PerLayerLearned, LearnedPolicy):
        policy = build(cls, fp, budget=16, interval=4, groups=ALL_GROUPS, spread=0.02)
        rec = Counter(policy)
        res = foresight.generate(model, tok, ["a b c d e f", "g h"], policy=policy, budget=16, interval=4,
                                 max_new_tokens=40, stop_on_eos=False, **kept)
        out[cls] = (res.token_ids, rec)
    assert out[PerLayerLearned][0] == out[LearnedPolicy][0]
    assert out[LearnedPolicy][1].calls > 0 == out[PerLayerLearned][1].calls
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(out[LearnedPolicy][1].keeps, out[PerLayerLearned][1].keeps))


def test_a_nan_score_names_its_layer_on_the_all_layers_path():
    model, tok = get_model("tiny-llama")
    policy = build(LearnedPolicy, foresight.model_fingerprint(model), budget=16, interval=4)
    assert policy.scores_layers
    with torch.no_grad():
        policy.model.b2[1, 0] = float("nan")
    with pytest.raises(ForesightError, match="NaN/Inf scores at event 0, layer 1"):
        foresight.generate(model, tok, ["a b c d e f"], policy=policy, budget=16, interval=4, max_new_tokens=40,
                           stop_on_eos=False)


def test_a_piecewise_replay_with_gradients_keeps_the_same_entries():
    """With gradients recorded the layers hold plain tensors, not views of the shared buffers: they are stacked and
    gathered one by one, with the same kept entries and the same CE and gradients as layer by layer."""
    from foresight.tiny_models import build_tiny_model

    model, _ = build_tiny_model("tiny-llama")
    seq = torch.randint(3, 250, (57,), generator=torch.Generator().manual_seed(0)).tolist()
    out = {}
    for cls in (PerLayerLearned, LearnedPolicy):
        policy = build(cls, foresight.model_fingerprint(model), budget=16, interval=4, groups=ALL_GROUPS,
                       spread=0.02)
        rec = Counter(policy)
        model.zero_grad()
        total = []
        res = foresight.replay(model, [seq], policy, 16, 4, engine="piecewise", grad=True,
                               on_logits=lambda s, e, logits: total.append(torch.log_softmax(logits, -1)[..., 7].sum()))
        torch.stack(total).sum().backward()
        out[cls] = (res, rec, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (a, ra, ga), (b, rb, gb) = out[PerLayerLearned], out[LearnedPolicy]
    assert rb.calls == b.stats["evictions"] > 0 == ra.calls
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(ra.keeps, rb.keeps)) and len(ra.keeps) == len(rb.keeps)
    torch.testing.assert_close(a.ce, b.ce, equal_nan=True)
    assert ga.keys() == gb.keys() and ga
    for name, g in ga.items():
        torch.testing.assert_close(gb[name], g, atol=1e-6, rtol=1e-5)
