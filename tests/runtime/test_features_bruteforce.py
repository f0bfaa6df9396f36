"""Brute force for the cumulative attention features (docs/training.md) and their standardisation.

The cumulative and decayed sums of :mod:`foresight.features` must cover **every** query since an entry
arrived, the prompt's included, not only the last ``W`` rows at each event. Here an independent log records,
for every forward step of every layer, the queries, the cached keys and the logical positions of the cache
the model actually attended to (the evicted one), recomputes the full attention matrix from them, and sums
it per logical position in closed form:

* ``cum(p, k) = sum over every query before event k of its attention to position p``;
* ``dec(p, k) = sum over the same queries of 0.9 ** (k - e) * attention``, with ``e`` the number of events
  before the query.

The extractor's features of every candidate at every event and layer must equal them, along odd eviction
trajectories (different per KV head), with prefills longer than ``W`` (a long first replay piece; a prompt
longer than ``B`` compressed right after prefill) and batches.

The ``recency`` features (LazyEviction's ``t - last`` and ``mri`` per query head, a query activating an entry
when it pays it at least the uniform share of its attention) are checked the same way against plain-Python
bookkeeping by logical position over every logged query.

The ``neighbors`` features (each candidate's cache neighbours: evicted positions between, key cosines, their
last-W attention) are checked against per-entry bookkeeping over the views.

The scorer's feature standardisation is fitted on a seeded uniform sample of the events of all training traces
(not the first events, i.e. the first trace or two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

import foresight
from foresight.feature_groups import ATTN_STATS, LOG_EPS, feature_columns
from foresight.features import FeatureExtractor
from foresight.policies.base import EvictionPolicy
from foresight.policies.recorder import FeatureRecorder

B, W, DECAY = 16, 4, 0.9


@dataclass
class _StepLog(EvictionPolicy):
    """Driver that evicts along an odd per-head trajectory and logs what every query attended to."""

    name = "step_log"
    observes = True
    steps: list = field(default_factory=list)  # (layer, events so far, probs (b, h, g, q, n), positions (b, h, n))
    # (layer, events so far, view.probs, visible (b, h, g, q), query positions, positions, query validity)
    rows: list = field(default_factory=list)
    events: int = 0

    def reset(self, *args, **kwargs):
        self.steps.clear()
        self.rows.clear()
        self.events = 0

    def observe(self, view):
        q, k = view.query.float(), view.keys.float()
        b, hq, nq, d = q.shape
        hkv = k.shape[1]
        g = hq // hkv
        logits = torch.einsum("bhgqd,bhnd->bhgqn", q.view(b, hkv, g, nq, d), k) * d**-0.5
        # the mask from logical positions alone: a query sees valid entries at or before its own position
        qpos = view.query_positions[:, None, None, :, None]
        allowed = (view.positions[:, :, None, None, :] <= qpos) & view.valid[:, :, None, None, :]
        probs = logits.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
        # left-padding queries (the newest entries are this step's tokens) attend to nothing real; drop them
        probs = probs * view.valid[:, :, None, -nq:, None]
        torch.testing.assert_close(probs, view.probs * view.valid[:, :, None, -nq:, None], rtol=1e-4, atol=1e-5)
        self.steps.append((view.layer_idx, self.events, probs, view.positions.clone()))
        visible = allowed.sum(-1).expand(b, hkv, g, nq)
        self.rows.append((view.layer_idx, self.events, view.probs.clone(), visible, view.query_positions.clone(),
                          view.positions.clone(), view.valid[:, :, -nq:].clone()))

    def score(self, view):
        pos = view.candidate_positions.float()
        head = torch.arange(pos.shape[1], dtype=pos.dtype)[None, :, None]
        return torch.sin(pos * (1.7 + head))  # keeps differ per KV head and are not recency

    def on_evict(self, layer_idx, keep):
        if layer_idx == 0:
            self.events += 1


def _reference(log: _StepLog, layer: int, event: int, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, h, g, N) cumulative and decayed attention per logical position, from every query before ``event``."""
    cum = dec = None
    for lay, before, probs, pos in log.steps:
        if lay != layer or before > event:
            continue
        b, h, g, _, n = probs.shape
        per_entry = probs.sum(3)  # every query of the step
        idx = pos[:, :, None, :].expand(b, h, g, n)
        add = torch.zeros(b, h, g, num_positions).scatter_add_(-1, idx, per_entry)
        cum = add if cum is None else cum + add
        dec = (DECAY ** (event - before)) * add + (0 if dec is None else dec)
    return cum, dec


def _check(got: list, log: _StepLog, num_positions: int, min_events: int) -> None:
    assert len({ev[0] for ev in got}) >= min_events
    for event, layer, cand, valid, feats in got:
        cum, dec = _reference(log, layer, event, num_positions)
        b, h, c = cand.shape
        g = feats.shape[-1] // ATTN_STATS
        stats = feats.view(b, h, c, g, ATTN_STATS)
        idx = cand[:, :, None, :].expand(b, h, g, c)
        want_cum = cum.gather(-1, idx).transpose(-1, -2)  # (b, h, c, g)
        want_dec = dec.gather(-1, idx).transpose(-1, -2)
        msg = f"event {event}, layer {layer}"
        real = valid[..., None].expand(b, h, c, g)  # left padding is evicted first and never attended to
        torch.testing.assert_close(stats[..., 6][real], torch.log(want_cum + LOG_EPS)[real], rtol=1e-4, atol=1e-4,
                                   msg=msg)
        torch.testing.assert_close(stats[..., 7][real], torch.log(want_dec + LOG_EPS)[real], rtol=1e-4, atol=1e-4,
                                   msg=msg)


def _recency_reference(log: _StepLog, layer: int, event: int) -> tuple[dict, dict]:
    """last and mri per (row, KV head, query head, logical position) from every query before ``event``."""
    last, mri = {}, {}
    for lay, before, probs, visible, qpos, pos, qvalid in log.rows:
        if lay != layer or before > event:
            continue
        b, h, g, q, n = probs.shape
        for bi in range(b):
            for hi in range(h):
                for gi in range(g):
                    for j in range(n):
                        last.setdefault((bi, hi, gi, int(pos[bi, hi, j])), int(pos[bi, hi, j]))
                        mri.setdefault((bi, hi, gi, int(pos[bi, hi, j])), 0)
                    for i in range(q):  # rows in order
                        if not qvalid[bi, hi, i]:
                            continue  # a left-padding query
                        t = int(qpos[bi, i])
                        for j in range(n):
                            if float(probs[bi, hi, gi, i, j]) * int(visible[bi, hi, gi, i]) >= 1:
                                key = (bi, hi, gi, int(pos[bi, hi, j]))
                                mri[key] = max(mri[key], t - last[key])
                                last[key] = t
    return last, mri


def _check_recency(got: list, log: _StepLog, min_events: int) -> None:
    assert len({ev[0] for ev in got}) >= min_events
    active = 0
    for event, layer, cand, valid, feats, now in got:
        last, mri = _recency_reference(log, layer, event)
        b, h, c = cand.shape
        g = feats.shape[-1] // 2
        stats = feats.view(b, h, c, g, 2)
        for bi in range(b):
            for hi in range(h):
                for ci in range(c):
                    if not valid[bi, hi, ci]:
                        continue
                    for gi in range(g):
                        key = (bi, hi, gi, int(cand[bi, hi, ci]))
                        since = int(now[bi, hi]) + 1 - last[key]
                        want = torch.log1p(torch.tensor([since, mri[key]], dtype=torch.float32))
                        torch.testing.assert_close(stats[bi, hi, ci, gi], want, msg=f"event {event}, layer {layer}")
                        active += mri[key] > 0
    assert active > 0  # some entries recurred: the test exercises the recurrence, not only the entry rule


def _recorder(log: _StepLog, got: list) -> FeatureRecorder:
    def on_event(view, feats):
        c = view.num_candidates
        got.append((view.event, view.layer_idx, view.candidate_positions.clone(), view.valid[..., :c].clone(),
                    feats.clone(), view.positions.amax(-1)))

    return FeatureRecorder(extractor=FeatureExtractor(window=W, feature_set=("attn", "recency"), decay=DECAY),
                           driver=log, on_event=on_event)


def _split(got: list, model) -> tuple[list, list]:
    """The recorded features split into the attn group and the recency group."""
    cfg = model.config
    d, g = cfg.hidden_size // cfg.num_attention_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or d
    cols = {name: feature_columns((name,), ("attn", "recency"), d, g) for name in ("attn", "recency")}
    return ([(*ev[:4], ev[4][..., cols["attn"]]) for ev in got],
            [(*ev[:4], ev[4][..., cols["recency"]], ev[5]) for ev in got])


@pytest.mark.parametrize("chunk", [None, B + W])
def test_cumulative_features_equal_full_attention_sums_in_replay(tiny, chunk):
    """Teacher-forced replay (pieces of W, or one first piece of B + W queries), batch of two."""
    model, _ = tiny
    seq = torch.randint(3, 250, (2, 48), generator=torch.Generator().manual_seed(3))
    log, got = _StepLog(), []
    foresight.replay(model, seq, _recorder(log, got), B, W, chunk=chunk)
    attn, recency = _split(got, model)
    _check(attn, log, seq.shape[1], min_events=6)
    _check_recency(recency, log, min_events=6)


def test_cumulative_features_include_a_compressed_prompt(tiny):
    """Generation: a prompt longer than B (prefilled in pieces cut at the event points), left padding in one
    batch (align="batch": one padded schedule), then token-by-token decoding."""
    model, tok = tiny
    prompts = [list(range(5, 35)), list(range(40, 62))]
    log, got = _StepLog(), []
    res = foresight.generate(model, tok, prompts, policy=_recorder(log, got), budget=B, interval=W,
                             max_new_tokens=20, stop_on_eos=False, align="batch")
    assert res.stats["evictions"] >= 5
    attn, recency = _split(got, model)
    _check(attn, log, 30 + 20, min_events=5)
    _check_recency(recency, log, min_events=5)


# ---------------------------------------------------------------------------------------------------------------
# Feature standardisation: fitted on events sampled across all training traces
# ---------------------------------------------------------------------------------------------------------------


def test_normalizer_sample_is_seeded_distinct_and_uniform():
    from training.sl import normalizer_sample

    a = normalizer_sample(40, seed=3, size=8)
    assert torch.equal(a, normalizer_sample(40, seed=3, size=8)) and not torch.equal(a, normalizer_sample(40, 4, 8))
    assert len(set(a.tolist())) == 8 and torch.equal(a, a.sort().values)
    assert torch.equal(normalizer_sample(5, seed=0, size=8), torch.arange(5))  # fewer events than the sample
    counts = torch.zeros(40)
    for seed in range(2000):
        counts[normalizer_sample(40, seed, 8)] += 1
    assert counts.min() > 300 and counts.max() < 500  # each event expected 2000 * 8 / 40 = 400 times


def test_sl_standardisation_is_fitted_on_events_of_all_training_traces(tmp_path, monkeypatch):
    from tests.training.test_sl import _cfg, _make_data
    from training import sl
    from training.distributed import DistInfo

    monkeypatch.setattr(sl, "NORMALIZER_EVENTS", 16)
    data = _make_data(tmp_path / "data")
    task = sl.SLTask(_cfg(data, tmp_path / "run"), DistInfo(0, 1, 0, torch.device("cpu")))
    feats = task.train["features"][:].float()  # (E, L, K, C, D): events of the training traces, in trace order
    num = feats.shape[0]
    idx = sl.normalizer_sample(num, task.cfg.seed, 16)
    per_trace = torch.tensor([len(task.labels[r["trace_id"]].events) for r in task.train_rows])
    trace_of_event = torch.repeat_interleave(torch.arange(len(task.train_rows)), per_trace)
    assert len(trace_of_event) == num > 16
    assert len(set(trace_of_event[idx].tolist())) == len(task.train_rows) > 1  # every trace (a prefix: 2 or 3)
    # the fitted statistics are exactly those of the sampled events, per (layer, KV head, feature)
    x = feats[idx].permute(1, 2, 0, 3, 4).flatten(2, 3)  # (L, K, events * C, D)
    torch.testing.assert_close(task.module.feature_mean, x.mean(2))
    torch.testing.assert_close(task.module.feature_std, x.std(2, unbiased=False).clamp(min=1e-4))
    assert task.scorer_config.provenance["normalizer_events"] == 16


# ---------------------------------------------------------------------------------------------------------------
# The neighbours group: each candidate's cache neighbours, from the cache as the evictions left it
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("align", ["replay", "generate"])
def test_neighbor_features_equal_a_per_entry_reference(tiny, align):
    """At every event, layer, row and KV head, the ``neighbors`` columns equal plain-Python bookkeeping over the
    view: evicted positions between a candidate and its cache neighbours, the cosine of their pre-RoPE keys, and
    each neighbour's last-W attention (the attn group's own sum over the last W queries, mean over the query
    heads, where the neighbour is a candidate too). Odd per-head trajectories; a padded batch in generation."""
    model, tok = tiny
    fs = ("attn", "neighbors")
    got = []

    def on_event(view, feats):
        c = view.num_candidates
        got.append((view.positions.clone(), view.valid.clone(), view.prerope_keys(c + 1), c, feats.clone()))

    rec = FeatureRecorder(extractor=FeatureExtractor(window=W, feature_set=fs, decay=DECAY), driver=_StepLog(),
                          on_event=on_event)
    if align == "replay":
        foresight.replay(model, torch.randint(3, 250, (2, 48), generator=torch.Generator().manual_seed(5)), rec, B, W)
    else:
        foresight.generate(model, tok, [list(range(5, 35)), list(range(40, 52))], policy=rec, budget=B, interval=W,
                           max_new_tokens=20, stop_on_eos=False, align="batch")
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    attn_cols, nb_cols = (feature_columns((name,), fs, d, g) for name in fs)
    floor, checked, gaps = torch.log(torch.tensor(LOG_EPS)).item(), 0, 0
    for pos, valid, keys, c, feats in got:
        nb, sum_w = feats[..., nb_cols], feats[..., attn_cols].unflatten(-1, (g, ATTN_STATS))[..., 2]
        for bi in range(pos.shape[0]):
            for hi in range(pos.shape[1]):
                for i in range(c):
                    if not valid[bi, hi, i]:
                        continue
                    p = pos[bi, hi].tolist()
                    has_l, has_r = i > 0 and bool(valid[bi, hi, i - 1]), bool(valid[bi, hi, i + 1])
                    gap_l = p[i] - p[i - 1] - 1 if has_l else p[i]
                    gap_r = p[i + 1] - p[i] - 1 if has_r else 0
                    k = torch.nn.functional.normalize(keys[bi, hi], dim=-1)
                    cos_l = float(k[i] @ k[i - 1]) if has_l else 0.0
                    cos_r = float(k[i] @ k[i + 1]) if has_r else 0.0
                    want = torch.tensor([math.log1p(gap_l), math.log1p(gap_r), cos_l, cos_r])
                    torch.testing.assert_close(nb[bi, hi, i, :4], want, rtol=1e-5, atol=1e-5)
                    # a neighbour's attention: log(mean over G of sum_W), from the attn group's log(sum_W + eps)
                    for col, j, has in ((4, i - 1, has_l), (5, i + 1, has_r)):
                        if not has:
                            assert nb[bi, hi, i, col].item() == pytest.approx(floor)
                        elif j < c:
                            mean = (sum_w[bi, hi, j].exp() - LOG_EPS).mean()
                            assert nb[bi, hi, i, col].item() == pytest.approx(math.log(mean + LOG_EPS), abs=1e-4)
                    checked += 1
                    gaps += gap_l > 0
    assert checked > 100 and gaps > 20  # evictions left holes: the gaps are exercised, not only zeros
