"""A decode step of every layer at once (``observe_layers``, one batched attention) leaves the policies exactly
where observing layer by layer leaves them: every score and every kept index equal bit for bit, by hand on a
4-layer cache (decode, a prompt longer than B + W, a left-padded batch) and end to end on the tiny models."""

from __future__ import annotations

import pytest
import torch

import foresight
from foresight.attention import foresight_attention, route, unroute
from foresight.cache import BudgetedCache
from foresight.policies import make_policy
from foresight.schedule import CacheConfig
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import TINY, get_model

L, HQ, HKV, D, B, W = 4, 6, 2, 16, 24, 8
POLICIES = ["h2o", "lazy", "learned"]


def build(name: str, fingerprint: dict, layers: bool, budget: int = B, interval: int = W):
    if name == "learned":  # a scorer of the cache's own setting (another one is refused)
        cfg = ScorerConfig(fingerprint=fingerprint, budget=budget, interval=interval,
                           feature_set=("key", "value", "attn", "age"))
        policy = make_policy("learned", scorer=Scorer(cfg, seed=0))
    else:
        policy = make_policy(name)
    if not layers:
        object.__setattr__(policy, "observes_layers", False)  # the layer-by-layer path
    return policy


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


class Module:
    def __init__(self, i):
        self.layer_idx, self.scaling, self.is_causal, self.training = i, D**-0.5, True, False
        self.num_key_value_groups = HQ // HKV


def drive_by_hand(policy, steps: int, prompt: int, batch: int = 1, pad: int = 0) -> BudgetedCache:
    cache = BudgetedCache.from_shape(L, HQ // HKV, policy, CacheConfig(B, W))
    modules = [Module(i) for i in range(L)]
    gen = torch.Generator().manual_seed(0)
    fed = 0
    for s in range(steps):
        pieces = [(a, b) for a, b, _ in cache.pieces(prompt)] if s == 0 else [(fed, fed + 1)]
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


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("case", [dict(steps=90, prompt=5), dict(steps=30, prompt=70),
                                  dict(steps=60, prompt=9, batch=2, pad=3)], ids=["decode", "long prompt", "padded"])
def test_all_layers_at_once_equals_layer_by_layer(name, case):
    runs = {}
    for layers in (False, True):
        policy = build(name, FINGERPRINT, layers)
        rec = Recorder(policy)
        cache = drive_by_hand(policy, **case)
        runs[layers] = (rec, cache)
    (a, ca), (b, cb) = runs[False], runs[True]
    assert ca.events == cb.events > 2 and len(a.log) == len(b.log) > 0
    assert all(torch.equal(x, y) for x, y in zip(a.log, b.log))
    assert a.batched == 0 and b.batched > 0  # the batched path ran (a padded batch: once the padding is evicted)


@pytest.mark.parametrize("model_name", TINY)
@pytest.mark.parametrize("name", POLICIES)
def test_generation_is_the_same_either_way(model_name, name):
    model, tok = get_model(model_name)
    fp = foresight.model_fingerprint(model)
    out = {}
    for layers in (False, True):
        policy = build(name, fp, layers, budget=16, interval=4)
        rec = Recorder(policy)
        res = foresight.generate(model, tok, ["a b c d e f", "g h"], policy=policy, budget=16, interval=4,
                                 max_new_tokens=40, stop_on_eos=False)
        out[layers] = (res.token_ids, rec)
    assert out[False][0] == out[True][0]
    assert all(torch.equal(x, y) for x, y in zip(out[False][1].log, out[True][1].log))
    assert out[True][1].batched > 0
