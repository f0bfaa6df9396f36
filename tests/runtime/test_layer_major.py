"""Layer-major replay (foresight.layer_major) against piecewise replay: the same CE, evictions, policy state, golden
labels and gradients for every per-layer policy; the fallback for a policy that is not per-layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import foresight
import foresight.runtime
from foresight.cache import BudgetedCache
from foresight.layer_major import layer_major_reason, spans
from foresight.policies import make_policy, policy_names
from foresight.policies.base import EvictionPolicy
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model

B, W = 16, 4


def _seqs(lengths=(70, 57), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]


def _scorer(model, seed=0, **config) -> Scorer:
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W,
                       feature_set=("prekey", "value", "attn", "age", "recency", "neighbors"), hidden=8, **config)
    return Scorer(cfg, seed=seed)


def _recording(policy):
    """``policy`` with its ``on_evict`` (and ``on_evict_layers``, all layers of an event at once: piecewise replay of
    ``learned``) recording the kept indices per layer, in order."""
    kept: dict[int, list[torch.Tensor]] = {}
    on_evict, on_evict_layers = policy.on_evict, policy.on_evict_layers

    def record(layer_idx, keep):
        kept.setdefault(layer_idx, []).append(keep.clone())
        on_evict(layer_idx, keep)

    def record_layers(layers, keep):
        for layer_idx, k in zip(layers, keep):
            kept.setdefault(layer_idx, []).append(k.clone())
        on_evict_layers(layers, keep)

    policy.on_evict, policy.on_evict_layers = record, record_layers
    return policy, kept


def _both(model, make, seqs, **kw):
    """Replay ``seqs`` under a fresh ``make()`` with each engine: {engine: (result, kept per layer)}."""
    out = {}
    for engine in ("piecewise", "layer-major"):
        policy, kept = _recording(make())
        out[engine] = (foresight.replay(model, seqs, policy, B, W, engine=engine, **kw), kept)
    return out


def _assert_same(out, atol=1e-5):
    (a, ka), (b, kb) = out["piecewise"], out["layer-major"]
    assert (a.engine, b.engine) == ("piecewise", "layer-major")
    torch.testing.assert_close(a.ce, b.ce, atol=atol, rtol=0, equal_nan=True)
    torch.testing.assert_close(a.entropy, b.entropy, atol=atol, rtol=0, equal_nan=True)
    assert a.stats == b.stats and a.stats["evictions"] > 0
    assert ka.keys() == kb.keys() and ka
    for layer in ka:
        assert len(ka[layer]) == len(kb[layer]) == a.stats["evictions"]
        for x, y in zip(ka[layer], kb[layer]):
            assert torch.equal(x, y), layer


POLICY_ARGS = {"paged": {"block_size": 2}, "caote": {"inner": "tova"}, "streaming_llm": {"sinks": 2}}
HEURISTICS = [p for p in policy_names() if p not in ("full", "learned", "golden")]


@pytest.mark.parametrize("name", HEURISTICS)
def test_every_heuristic_evicts_alike_in_both_engines(tiny, name):
    model, _ = tiny
    out = _both(model, lambda: make_policy(name, **POLICY_ARGS.get(name, {})), _seqs(), sinks=1)
    _assert_same(out)


@pytest.mark.parametrize("selection", ["topk", "sample"])
def test_learned_evicts_alike_in_both_engines(tiny, selection):
    """Spread and momentum under top-k; under sampling every layer draws from its own seeded generator, so the draws
    do not depend on whether layers take turns per event (piecewise) or per span (layer-major)."""
    model, _ = tiny
    sc = _scorer(model)
    args = dict(spread=0.05, age_prior=0.05) if selection == "topk" else dict(temperature=0.7, seed=3)
    out = _both(model, lambda: make_policy("learned", scorer=sc, selection=selection, any_budget=True, **args),
                _seqs())
    _assert_same(out)
    if selection == "sample":  # the draws are seeded: another seed evicts otherwise
        other = _both(model, lambda: make_policy("learned", scorer=sc, selection="sample", temperature=0.7, seed=4,
                                                 any_budget=True), _seqs())
        assert any(not torch.equal(x, y) for x, y in zip(out["layer-major"][1][0], other["layer-major"][1][0]))


def test_golden_labels_and_their_replay_agree(tiny_llama, monkeypatch):
    """The oracle's full-cache pass (an observing policy, chunks of 256) labels alike in both engines, and replaying
    the labels evicts exactly alike."""
    from golden.oracle import label_trace

    model, _ = tiny_llama
    seqs = _seqs((180, 120), seed=1)
    engine = {}
    real = foresight.runtime._layer_major
    monkeypatch.setattr(foresight.runtime, "_layer_major", lambda policy, e: engine.setdefault("used", real(policy, e)))
    labels = [label_trace(model, s, B, W, trace_id=f"t{i}", chunk=64) for i, s in enumerate(seqs)]
    assert engine["used"] is True
    monkeypatch.setattr(foresight.runtime, "_layer_major", lambda policy, e: False)
    piecewise = [label_trace(model, s, B, W, trace_id=f"t{i}", chunk=64) for i, s in enumerate(seqs)]
    for a, b in zip(labels, piecewise):
        assert len(a.events) == len(b.events) > 10
        for x, y in zip(a.events, b.events):
            assert all(torch.equal(u, v) for u, v in zip(x.candidates, y.candidates))
            assert all(torch.equal(u, v) for u, v in zip(x.evicted, y.evicted))
            torch.testing.assert_close(x.alpha, y.alpha, atol=1e-6, rtol=1e-5)
    monkeypatch.setattr(foresight.runtime, "_layer_major", real)
    out = _both(model, lambda: make_policy("golden", labels=labels), seqs, trace_ids=["t0", "t1"])
    _assert_same(out)


@pytest.mark.parametrize("truncate", [False, True])
def test_gradients_agree(tiny_llama, truncate):
    """``grad=True`` (``train adapt``): the loss on every piece's logits reaches the weights alike."""
    from tests.conftest import seeded_lora
    from foresight.tiny_models import build_tiny_model

    model, _ = build_tiny_model("tiny-llama")
    peft = seeded_lora(model)
    lm = peft.get_base_model()
    seq = _seqs((60,))[0]
    grads = {}
    for engine in ("piecewise", "layer-major"):
        lm.zero_grad()
        total = []
        foresight.replay(lm, [seq], "h2o", B, W, grad=True, truncate_backprop=truncate, engine=engine,
                         on_logits=lambda s, e, logits: total.append(torch.log_softmax(logits, -1)[..., 7].sum()))
        torch.stack(total).sum().backward()
        grads[engine] = {n: p.grad.clone() for n, p in lm.named_parameters() if p.requires_grad}
    assert grads["piecewise"].keys() == grads["layer-major"].keys() and grads["piecewise"]
    for name, g in grads["piecewise"].items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(grads["layer-major"][name], g, atol=1e-5, rtol=1e-4)


@dataclass
class _CrossLayer(EvictionPolicy):
    """Decides every layer from layer 0's newest keys: not per-layer."""

    name: ClassVar[str] = "cross_layer"

    def score(self, view):
        return view.keys[..., : view.num_candidates, 0].float()


def test_a_policy_that_is_not_per_layer_runs_piecewise_and_says_why_once(tiny_llama, capsys):
    model, _ = tiny_llama
    assert layer_major_reason(_CrossLayer()) and layer_major_reason(make_policy("h2o")) is None
    first = foresight.replay(model, _seqs(), _CrossLayer(), B, W)
    second = foresight.replay(model, _seqs(), _CrossLayer(), B, W)
    assert first.engine == second.engine == "piecewise"
    err = capsys.readouterr().err
    assert err.count("does not declare per_layer") == 1 and "'cross_layer'" in err
    with pytest.raises(ValueError, match="engine='layer-major': policy 'cross_layer' does not declare per_layer"):
        foresight.replay(model, _seqs(), _CrossLayer(), B, W, engine="layer-major")
    with pytest.raises(ValueError, match="engine must be one of"):
        foresight.replay(model, _seqs(), "h2o", B, W, engine="fast")


def test_every_job_replays_layer_major(tiny_llama):
    """Golden labelling, SL features, DAgger, GRPO rollouts, fidelity and adaptation all replay per-layer policies."""
    from foresight.features import FeatureExtractor
    from foresight.policies.recorder import FeatureRecorder
    from golden.oracle import BlockAttentionObserver
    from training.onpolicy import MixturePolicy
    from training.rollout import RolloutPolicy

    model, _ = tiny_llama
    sc = _scorer(model)
    ext = FeatureExtractor(window=W)
    jobs = [BlockAttentionObserver(block_of=torch.zeros(1, dtype=torch.long), num_blocks=1),
            FeatureRecorder(extractor=ext, driver=make_policy("random")),
            MixturePolicy(extractor=ext, scorer=sc), RolloutPolicy(scorer=sc, any_budget=True),
            make_policy("learned", scorer=sc, any_budget=True), make_policy("caote:h2o")]
    assert [layer_major_reason(p) for p in jobs] == [None] * len(jobs)
    assert layer_major_reason(FeatureRecorder(extractor=ext, driver=_CrossLayer()))  # the driver decides


def test_spans_group_whole_pieces_up_to_the_limit():
    pieces = foresight.replay_schedule(100, 16, 4)
    grouped = spans(pieces, 24)
    assert [p for g in grouped for p in g] == pieces
    assert all(g[-1][1] - g[0][0] <= 24 for g in grouped) and len(grouped) == 5
    assert spans([(0, 30, False), (30, 40, True)], 24) == [[(0, 30, False)], [(30, 40, True)]]


def test_a_span_must_start_where_the_cache_stands(tiny_llama):
    model, _ = tiny_llama
    cache = BudgetedCache(model, "h2o", B, W)
    with pytest.raises(ValueError, match="consecutive pieces starting at token 0"):
        cache.feed_span([(4, 8, False)])
    with pytest.raises(ValueError, match="consecutive pieces"):
        cache.feed_span([(0, 4, False), (5, 8, False)])


@pytest.mark.parametrize("engine", ["piecewise", "layer-major"])
def test_a_replay_without_logits_evicts_alike_and_computes_no_ce(tiny, engine):
    """``logits=False`` (golden labelling, feature extraction, DAgger recording): the same evictions at every event
    and layer as with logits, NaN CE, and the LM head run on one position per forward instead of the whole piece."""
    model, _ = tiny
    out, heads = {}, {}
    for flag in (True, False):
        policy, kept = _recording(make_policy("h2o"))
        seen = heads[flag] = []
        hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o, seen=seen: seen.append(o.shape[1]))
        try:
            out[flag] = (foresight.replay(model, _seqs(), policy, B, W, engine=engine, logits=flag), kept)
        finally:
            hook.remove()
    (a, ka), (b, kb) = out[True], out[False]
    assert a.stats == b.stats and a.stats["evictions"] > 0 and a.engine == b.engine
    assert ka.keys() == kb.keys() and all(torch.equal(x, y) for l in ka for x, y in zip(ka[l], kb[l]))
    assert not a.ce.isnan().all() and b.ce.isnan().all() and b.entropy.isnan().all()
    assert set(heads[False]) == {1} and max(heads[True]) > 1
    sc = _scorer(model)
    for bad in (dict(on_logits=lambda *a: None), dict(grad=True)):
        with pytest.raises(ValueError, match="logits=False"):
            foresight.replay(model, _seqs(), make_policy("learned", scorer=sc, any_budget=True), B, W, logits=False,
                             **bad)
