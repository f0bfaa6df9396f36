"""Held decode steps of every layer at once (``observe_layers``, one batched attention per event) leave the
policies exactly where observing the same chunks layer by layer leaves them (every score and kept index equal bit
for bit), and where observing every step as it comes leaves them (scores to fp32 rounding, every kept index
equal): by hand on a 4-layer cache (decode, a prompt longer than B + W, a left-padded batch, a multi-token forward
between decode steps, the memory cap) and end to end on the tiny models."""

from __future__ import annotations

import pytest
import torch

import foresight
from foresight.attention import foresight_attention, route, unroute
from foresight.cache import BudgetedCache
from foresight.policies import EvictionPolicy, make_policy
from foresight.schedule import CacheConfig
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import TINY, get_model

L, HQ, HKV, D, B, W = 4, 6, 2, 16, 24, 8
POLICIES = ["h2o", "lazy", "learned", "tova", "snapkv", "rkv", "caote"]


def build(name: str, fingerprint: dict, held: bool = True, budget: int = B, interval: int = W):
    """The policy; ``held=False`` turns decode-step holding off (every step observed as it comes, per layer)."""
    if name == "learned":  # a scorer of the cache's own setting (another one is refused)
        cfg = ScorerConfig(fingerprint=fingerprint, budget=budget, interval=interval,
                           feature_set=("key", "value", "attn", "age", "recency"))
        policy = make_policy("learned", scorer=Scorer(cfg, seed=0))
    else:
        policy = make_policy(name)
    if not held:  # caote takes held steps when its inner policy does
        object.__setattr__(policy.inner if name == "caote" else policy, "observes_layers", False)
    return policy


def layer_by_layer(policy) -> None:
    """Make ``policy`` take every all-layers view through the base class: its layers one by one (``observe``)."""
    policy.observe_layers = lambda view: EvictionPolicy.observe_layers(policy, view)


class Recorder:
    """Every score and keep the cache asks of ``policy``, and how many all-layers steps it saw."""

    def __init__(self, policy):
        self.log, self.batched = [], 0
        score, on_evict, observe_layers = policy.score, policy.on_evict, policy.observe_layers

        def rec_score(view):
            out = score(view)
            self.log.append(out.clone())
            return out

        def rec_evict(layer_idx, keep):
            self.log.append(keep.clone())
            on_evict(layer_idx, keep)

        def rec_layers(view):
            self.batched += 1
            observe_layers(view)

        policy.score, policy.on_evict, policy.observe_layers = rec_score, rec_evict, rec_layers
        if policy.scores_layers:  # all layers of an event at once (tests/runtime/test_score_layers.py)
            score_layers, on_evict_layers = policy.score_layers, policy.on_evict_layers

            def rec_score_layers(view):
                out = score_layers(view)
                self.log.extend(out.clone())
                return out

            def rec_evict_layers(layers, keep):
                self.log.extend(keep.clone())
                on_evict_layers(layers, keep)

            policy.score_layers, policy.on_evict_layers = rec_score_layers, rec_evict_layers


class Module:
    def __init__(self, i):
        self.layer_idx, self.scaling, self.is_causal, self.training = i, D**-0.5, True, False
        self.num_key_value_groups = HQ // HKV


def drive_by_hand(policy, steps: int, prompt: int, batch: int = 1, pad: int = 0, chunk_at: int | None = None,
                  observe_bytes: int | None = None) -> BudgetedCache:
    """Feed a prompt, then ``steps`` decode steps; ``chunk_at``: a 3-token forward (e.g. a user turn) at that step."""
    cache = BudgetedCache.from_shape(L, HQ // HKV, policy, CacheConfig(B, W))
    if observe_bytes is not None:
        cache.observer.observe_bytes = observe_bytes
    modules = [Module(i) for i in range(L)]
    gen = torch.Generator().manual_seed(0)
    fed = 0
    for s in range(steps):
        pieces = [(a, b) for a, b, _ in cache.pieces(prompt)] if s == 0 else [(fed, fed + 1)]
        if s == chunk_at:
            pieces = [(a, b) for a, b, _ in cache.pieces(fed + 3)]
        for a, b in pieces:
            pos = torch.arange(a, b)[None].expand(batch, -1)
            valid = torch.ones(batch, b - a, dtype=torch.bool)
            if pad:
                valid[-1] = pos[-1] >= pad
            cache.begin_step(pos, valid)
            state = route([], cache)
            try:
                for i in range(L):
                    k, v = (torch.randn(batch, HKV, b - a, D, generator=gen) for _ in range(2))
                    q = torch.randn(batch, HQ, b - a, D, generator=gen) * 2
                    keys, values = cache.update(k, v, i)
                    mask = cache.attention_mask(i, b - a, q.dtype)
                    foresight_attention(modules[i], q, keys, values, mask, scaling=modules[i].scaling, dropout=0.0)
            finally:
                unroute(state)
            cache.end_step()
            fed = b
    return cache


FINGERPRINT = {"model": "by-hand", "model_type": "llama", "num_layers": L, "num_kv_heads": HKV, "num_heads": HQ,
               "head_dim": D, "vocab_size": 10}


CASES = [dict(steps=90, prompt=5), dict(steps=30, prompt=70), dict(steps=60, prompt=9, batch=2, pad=3),
         dict(steps=70, prompt=5, chunk_at=33)]
CASE_IDS = ["decode", "long prompt", "padded", "multi-token forward"]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_all_layers_at_once_equals_layer_by_layer(name, case):
    runs = {}
    for batched in (False, True):
        policy = build(name, FINGERPRINT)
        rec = Recorder(policy)
        if not batched:
            layer_by_layer(policy)  # after the recorder: these calls are not counted as batched
        cache = drive_by_hand(policy, **case)
        runs[batched] = (rec, cache)
    (a, ca), (b, cb) = runs[False], runs[True]
    assert ca.events == cb.events > 2 and len(a.log) == len(b.log) > 0
    assert all(torch.equal(x, y) for x, y in zip(a.log, b.log))
    assert a.batched == 0 and b.batched > 0  # the batched path ran (a padded batch: once the padding is evicted)


def assert_same_run(a: Recorder, b: Recorder) -> None:
    """Every kept index equal; every score equal up to fp32 summation order."""
    assert len(a.log) == len(b.log) > 0
    for x, y in zip(a.log, b.log):
        if x.dtype == torch.long:
            assert torch.equal(x, y)
        else:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_held_steps_equal_steps_observed_as_they_come(name, case):
    recs, caches = {}, {}
    for held in (False, True):
        policy = build(name, FINGERPRINT, held=held)
        recs[held] = Recorder(policy)
        caches[held] = drive_by_hand(policy, **case)
    assert caches[False].events == caches[True].events > 2
    assert_same_run(recs[False], recs[True])
    # The keys are read once per event, not once per decode step (the point of holding them).
    assert recs[False].batched == 0 and 0 < recs[True].batched <= caches[True].events + 1


@pytest.mark.parametrize("name", POLICIES)
def test_memory_cap_hands_over_early_with_the_same_result(name):
    recs = {}
    for cap in (None, 1):  # 1 byte: every decode step is handed over at once
        policy = build(name, FINGERPRINT)
        recs[cap] = Recorder(policy)
        drive_by_hand(policy, steps=90, prompt=5, observe_bytes=cap)
    assert recs[1].batched > 80 > recs[None].batched  # one hand-over per decode step under the cap
    assert_same_run(recs[None], recs[1])


@pytest.mark.parametrize("model_name", TINY)
@pytest.mark.parametrize("name", POLICIES)
def test_generation_is_the_same_either_way(model_name, name):
    model, tok = get_model(model_name)
    fp = foresight.model_fingerprint(model)
    out = {}
    for held in (False, True):
        policy = build(name, fp, held=held, budget=16, interval=4)
        rec = Recorder(policy)
        res = foresight.generate(model, tok, ["a b c d e f", "g h"], policy=policy, budget=16, interval=4,
                                 max_new_tokens=40, stop_on_eos=False)
        out[held] = (res.token_ids, rec)
    assert out[False][0] == out[True][0]
    assert_same_run(out[False][1], out[True][1])
    assert out[True][1].batched > 0 and out[False][1].batched == 0
