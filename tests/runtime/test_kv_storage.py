"""The budgeted cache's storage (foresight/kv_storage.py): every layer's entries in buffers shared by all
layers, growth for all layers at once, and the way back from plain tensors after a step with gradients."""

from __future__ import annotations

import torch

from foresight.cache import BudgetedCache
from foresight.schedule import CacheConfig

L, HKV, D = 3, 2, 4


def feed(cache, start: int, q: int, gen, grad: bool = False):
    pos = torch.arange(start, start + q)[None]
    cache.begin_step(pos, torch.ones(1, q, dtype=torch.bool))
    out = []
    for i in range(L):
        k = torch.randn(1, HKV, q, D, generator=gen, requires_grad=grad)
        v = torch.randn(1, HKV, q, D, generator=gen, requires_grad=grad)
        with torch.set_grad_enabled(grad):
            cache.update(k, v, i)
        out.append((k.detach(), v.detach()))
    cache.end_step()
    return out


def test_layers_are_views_of_shared_buffers_that_grow_together():
    cache = BudgetedCache.from_shape(L, 1, "full", CacheConfig(None, None))
    gen = torch.Generator().manual_seed(0)
    fed = [feed(cache, 0, 50, gen)] + [feed(cache, 50 + t, 1, gen) for t in range(30)]  # 80 > the first 64
    keys = cache.shared.keys(80)
    assert keys.shape == (L, 1, HKV, 80, D) and cache.shared.capacity >= 80
    for i, layer in enumerate(cache.layers):
        want = torch.cat([step[i][0] for step in fed], dim=2)
        assert torch.equal(layer.keys, want) and torch.equal(keys[i], want)
        assert layer.keys.data_ptr() == cache.shared.tensors[0][i].data_ptr()  # a view, not a copy
        assert torch.equal(layer.positions[0, 0], torch.arange(80))


def test_a_step_with_gradients_then_one_without_keeps_every_entry():
    cache = BudgetedCache.from_shape(L, 1, "full", CacheConfig(None, None))
    gen = torch.Generator().manual_seed(1)
    fed = [feed(cache, 0, 5, gen), feed(cache, 5, 3, gen, grad=True)]
    assert all(layer._buffers is None and layer.keys.requires_grad for layer in cache.layers)  # out of place
    fed.append(feed(cache, 8, 1, gen))  # back into the shared buffers
    for i, layer in enumerate(cache.layers):
        want = torch.cat([step[i][1] for step in fed], dim=2)
        assert layer._buffers is not None and torch.equal(layer.values.detach(), want)
        assert torch.equal(cache.shared.tensors[1][i, :, :, :9], want)
