"""The ``prekey`` feature: cached keys with RoPE undone equal what the key projection produced.

A brute force logs, with forward hooks on every layer's ``k_proj`` (``k_norm`` where the model has one: Qwen3),
the pre-RoPE key of every token in the very replay that evicts (the hidden states of layers past the first
depend on the evicted cache, so the log must come from the same run). At every event of every layer, the
``prekey`` features of each candidate must equal the logged key of the token at that logical position, per KV
head, along an odd eviction trajectory that differs per head; the post-RoPE ``key`` features must not (they
rotate with the position), so the check can fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import foresight
from foresight.cache import BudgetedCache
from foresight.features import FeatureExtractor
from foresight.models import rope_of
from foresight.policies.base import EvictionPolicy
from foresight.policies.recorder import FeatureRecorder
from foresight.schedule import CacheConfig
from foresight.views import EvictView, unrotate_keys

B, W = 12, 4


@dataclass
class _OddEvictions(EvictionPolicy):
    """Keeps differ per KV head and are not recency (the keys then sit at scattered positions)."""

    name = "odd_evictions"

    def score(self, view):
        pos = view.candidate_positions.float()
        head = torch.arange(pos.shape[1], dtype=pos.dtype)[None, :, None]
        return torch.sin(pos * (1.3 + head))


def _log_prerope(model, which: str) -> tuple[list, list]:
    """Hooks appending each layer's pre-RoPE queries or keys (batch, q, heads, d) per forward: (log, handles)."""
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    log = [[] for _ in model.model.layers]
    handles = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        module = getattr(attn, f"{which}_norm", None) or getattr(attn, f"{which}_proj")

        def hook(mod, args, out, i=i):
            log[i].append(out.detach().float().reshape(out.shape[0], out.shape[1], -1, d))

        handles.append(module.register_forward_hook(hook))
    return log, handles


def test_prekey_features_equal_the_projected_keys_in_an_evicting_replay(tiny):
    model, _ = tiny
    seq = torch.randint(3, 250, (2, 40), generator=torch.Generator().manual_seed(5))
    got = []

    def on_event(view, feats):
        got.append((view.layer_idx, view.candidate_positions.clone(), feats.clone()))

    ext = FeatureExtractor(window=W, feature_set=("prekey", "key"))
    log, handles = _log_prerope(model, "k")
    try:
        foresight.replay(model, seq, FeatureRecorder(extractor=ext, driver=_OddEvictions(), on_event=on_event), B, W)
    finally:
        for h in handles:
            h.remove()
    assert len(got) >= 5 * len(model.model.layers)
    moved = 0.0
    for layer, cand, feats in got:
        ref = torch.cat(log[layer], dim=1).transpose(1, 2)  # (batch, Hkv, N, d): every position, fed in order
        d = ref.shape[-1]
        want = ref.gather(2, cand[..., None].expand(*cand.shape, d))
        torch.testing.assert_close(feats[..., :d], want, rtol=1e-4, atol=1e-4, msg=f"layer {layer}")
        moved = max(moved, float((feats[..., d:] - want).abs().max()))
    assert moved > 1e-2  # the post-RoPE keys differ: the comparison can fail


def test_unrotate_keys_inverts_transformers_rope_at_any_scaling():
    """Against transformers' own ``apply_rotary_pos_emb`` with an attention scaling other than one."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 3, 7, 8, generator=g)
    pos = torch.randint(0, 5000, (2, 7), generator=g)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = pos[..., None].float() * inv_freq
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos() * 1.7, emb.sin() * 1.7
    _, rotated = apply_rotary_pos_emb(k, k, cos, sin)
    back = unrotate_keys(rotated, pos[:, None].expand(2, 3, 7), inv_freq, 1.7)
    torch.testing.assert_close(back, k, rtol=1e-4, atol=1e-4)


def test_prekey_needs_the_models_rotary_embedding(tiny_llama):
    model, _ = tiny_llama
    view = EvictView(torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8), torch.arange(6)[None, None],
                     torch.ones(1, 1, 6, dtype=torch.bool), num_candidates=4, num_keep=2, event=0, step=0,
                     layer_idx=0)
    ext = FeatureExtractor(window=W, feature_set=("prekey",))
    ext.reset(1, 1)
    with pytest.raises(ValueError, match="pre-RoPE keys need the rotary embedding"):
        ext.features(view)
    cache = BudgetedCache.from_shape(2, 1, "h2o", CacheConfig(B, W))
    assert cache.rope is None
    inv_freq, scaling = rope_of(model)
    assert BudgetedCache(model, "h2o", B, W).rope[1] == scaling and inv_freq.dtype == torch.float32
    rotary = model.model.rotary_emb
    rotary.rope_type, saved = "dynamic", rotary.rope_type  # frequencies that depend on the length: refused
    try:
        assert rope_of(model) is None
    finally:
        rotary.rope_type = saved


@pytest.mark.parametrize("path", ["replay", "generate"])
def test_query_features_equal_logits_of_the_projected_queries_and_keys(tiny, path):
    """The ``query`` group from the hooks' pre-RoPE queries and keys of the same evicting run: at every event and
    layer, per candidate and query head, the mean and the max over the last W queries of q.k/sqrt(d). Prefill chunks
    and single steps (replay, :meth:`observe`) and decode steps held to the event (generate, :meth:`observe_layers`);
    a window one query off differs, so the check can fail."""
    model, tok = tiny
    got = []

    def on_event(view, feats):
        got.append((view.layer_idx, view.candidate_positions.clone(), int(view.positions.max()), feats.clone()))

    rec = FeatureRecorder(extractor=FeatureExtractor(window=W, feature_set=("query",)), driver=_OddEvictions(),
                          on_event=on_event)
    qlog, h1 = _log_prerope(model, "q")
    klog, h2 = _log_prerope(model, "k")
    try:
        if path == "replay":
            foresight.replay(model, torch.randint(3, 250, (2, 40), generator=torch.Generator().manual_seed(5)), rec,
                             B, W)
        else:
            foresight.generate(model, tok, [list(range(5, 19)), list(range(40, 54))], policy=rec, budget=B,
                               interval=W, max_new_tokens=24, stop_on_eos=False)
    finally:
        for h in h1 + h2:
            h.remove()
    cfg = model.config
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    assert len(got) >= 4 * len(model.model.layers)
    shifted = 0.0
    for layer, cand, newest, feats in got:
        q = torch.cat(qlog[layer], dim=1)[:, : newest + 1].transpose(1, 2)  # (batch, Hq, N, d), fed in order
        k = torch.cat(klog[layer], dim=1)[:, : newest + 1].transpose(1, 2)  # (batch, Hkv, N, d)
        d = k.shape[-1]
        keys = k.gather(2, cand[..., None].expand(*cand.shape, d))  # (batch, Hkv, C, d)
        def stats(end):  # the W queries before position `end`
            last = q[:, :, end - W : end].unflatten(1, (-1, g))  # (batch, Hkv, G, W, d)
            logits = last @ keys[:, :, None].transpose(-1, -2) / d**0.5  # (batch, Hkv, G, W, C)
            return torch.cat([logits.mean(3), logits.amax(3)], dim=2).transpose(-1, -2)  # (batch, Hkv, C, 2G)

        torch.testing.assert_close(feats, stats(newest + 1), rtol=1e-4, atol=1e-4, msg=f"layer {layer}")
        shifted = max(shifted, float((feats - stats(newest)).abs().max()))
    assert shifted > 1e-2  # a window one query off would differ: the check can fail
