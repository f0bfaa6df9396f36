"""One sampler: the `learned` policy's selection=sample and GRPO's rollouts draw the same evictions."""

from __future__ import annotations

import pytest
import torch

import foresight
from foresight.policies import make_policy
from foresight.runtime import replay
from foresight.sampling import gumbel_topk, kept_indices, layer_generators, sample_eviction, top_keep
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model
from training.reward import reward_positions
from training.rollout import RolloutPolicy, collect_rollouts

B, W = 16, 4


def _scorer(model, seed=0, temperature=None) -> Scorer:
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8, temperature=temperature)
    return Scorer(cfg, seed=seed)


def _reset(pol, model):
    pol.reset(2, model.config.num_hidden_layers, "cpu", num_groups=sc_groups(model))


def sc_groups(model) -> int:
    return model.config.num_attention_heads // model.config.num_key_value_heads


class _View:
    event, layer_idx = 0, 0


def test_learned_sample_and_grpo_rollout_select_the_same_draw():
    """Same scores, seed and temperature: identical kept sets from both call sites, and the draw is the exact
    Plackett-Luce Gumbel-top-k draw over all drawable candidates (the one whose log-prob GRPO trains)."""
    model, _ = get_model("tiny-llama")
    sc = _scorer(model)
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 2, 20, generator=gen)
    scores[..., 0] = float("inf")  # a sink: never drawn
    learned = make_policy("learned", scorer=sc, selection="sample", temperature=0.7, seed=11)
    rollout = RolloutPolicy(scorer=sc, temperature=0.7, seed=11)
    for pol in (learned, rollout):
        _reset(pol, model)
    for _ in range(3):  # consecutive events consume the generator identically
        a = learned.select(scores, 12, _View())
        b = rollout.select(scores, 12, _View())
        assert torch.equal(a.sort(-1).values, b.sort(-1).values)
    ref_gen = layer_generators(11, 1)[0]  # layer 0's generator of seed 11
    free = torch.isfinite(scores)
    for _ in range(3):
        order = gumbel_topk((-scores / 0.7).masked_fill(~free, 0.0), 8, free, generator=ref_gen)
    (_, _, rec_order, _), = [rollout.records[(0, 0)]]
    assert torch.equal(rec_order, order)  # the last event's draw, from a fresh layer-0 generator of the same seed
    assert torch.equal(a.sort(-1).values, kept_indices(order, 20, 12))


def test_learned_sample_replay_equals_grpo_rollout():
    """End to end: a `learned` selection=sample replay and a one-rollout GRPO group with the same seed and the
    scorer's recorded temperature evict the same entries (identical per-token CE)."""
    model, _ = get_model("tiny-llama")
    sc = _scorer(model, seed=4, temperature=0.3)
    ids = torch.randint(3, 200, (45,), generator=torch.Generator().manual_seed(0)).tolist()
    full = replay(model, [ids], "full", None, W)
    pos = reward_positions(full.entropy[0], B + W, 0.2)
    ro = collect_rollouts(model, sc, ids, 1, B, W, temperature=0.3, seed=9, positions=pos, ce_full=full.ce[0],
                          eta=1.5)
    pol = make_policy("learned", scorer=sc, selection="sample", seed=9)  # temperature: the scorer's 0.3
    res = replay(model, [ids], pol, B, W)
    torch.testing.assert_close(res.ce[0], ro.ce[0], equal_nan=True, rtol=0, atol=0)
    other = replay(model, [ids], make_policy("learned", scorer=sc, selection="sample", seed=9, temperature=30.0), B, W)
    assert not torch.equal(other.ce[0], ro.ce[0])  # another temperature draws other evictions: the test can fail


def test_sample_temperature_defaults_to_the_scorers(tmp_path):
    model, _ = get_model("tiny-llama")
    _scorer(model, temperature=0.02).save_pretrained(tmp_path / "grpo")
    _scorer(model).save_pretrained(tmp_path / "sl")
    pol = make_policy("learned", scorer=str(tmp_path / "grpo"), selection="sample")
    assert pol.sampling_temperature == 0.02 and pol.config()["temperature"] == 0.02
    assert make_policy("learned", scorer=str(tmp_path / "grpo"), selection="sample",
                       temperature=0.5).sampling_temperature == 0.5
    with pytest.raises(ValueError, match=r"temperature=0.5 is used by selection=sample only, and selection is topk "
                                         r"\(the default\)"):  # top-k draws nothing; the scorer records no selection
        make_policy("learned", scorer=str(tmp_path / "grpo"), temperature=0.5)
    assert make_policy("learned", scorer=str(tmp_path / "sl")).sampling_temperature == 1.0  # nothing recorded
    with pytest.raises(ValueError, match="temperature"):
        ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, temperature=0.0)


def test_recorded_selection_is_the_default_and_an_explicit_one_overrides_it(tmp_path):
    """A scorer recording ``selection: sample`` makes the policy sample with no arguments: the very evictions of an
    explicit ``selection=sample`` run (identical per-token CE); an explicit ``topk`` overrides it (with the recorded
    spread, which sampling never applies), and the record names the selection that ran."""
    model, _ = get_model("tiny-llama")
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8, temperature=0.05,
                       spread=0.01, selection="sample")
    Scorer(cfg, seed=2).save_pretrained(tmp_path / "s")
    ids = torch.randint(3, 200, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    default = make_policy("learned", scorer=str(tmp_path / "s"), seed=5)
    assert (default.applied_selection, default.topk_spread) == ("sample", 0.0)
    assert default.config()["selection"] == "sample" and default.config()["spread"] == 0.0
    run = replay(model, [ids], default, B, W)
    explicit = replay(model, [ids], make_policy("learned", scorer=str(tmp_path / "s"), selection="sample", seed=5),
                      B, W)
    torch.testing.assert_close(run.ce[0], explicit.ce[0], equal_nan=True, rtol=0, atol=0)
    topk = make_policy("learned", scorer=str(tmp_path / "s"), selection="topk")
    assert (topk.applied_selection, topk.topk_spread, topk.config()["selection"]) == ("topk", 0.01, "topk")
    other = replay(model, [ids], topk, B, W)
    assert not torch.equal(other.ce[0], run.ce[0])  # top-k evicts other entries: the default did change something
    with pytest.raises(ValueError, match=r"spread=0.02 is used by selection=topk only, and selection is sample "
                                         r"\(this scorer's recorded default\)"):
        make_policy("learned", scorer=str(tmp_path / "s"), spread=0.02)
    assert make_policy("learned", scorer=str(tmp_path / "s"), temperature=0.5).sampling_temperature == 0.5


def test_scorer_config_selection_is_validated():
    fp = foresight.model_fingerprint(get_model("tiny-llama")[0])
    with pytest.raises(ValueError, match="selection must be one of topk, sample"):
        ScorerConfig(fp, budget=B, interval=W, temperature=0.1, selection="greedy")
    with pytest.raises(ValueError, match="selection 'sample' needs a recorded temperature"):
        ScorerConfig(fp, budget=B, interval=W, selection="sample")
    assert ScorerConfig(fp, budget=B, interval=W, selection="topk").selection == "topk"
    with pytest.raises(ValueError, match="selection must be one of topk, sample, got 'best'"):
        make_policy("learned", scorer=Scorer(ScorerConfig(fp, budget=B, interval=W, hidden=8)), selection="best")


def test_sample_eviction_matches_gumbel_topk_without_padding():
    scores = torch.randn(5, 3, 30, generator=torch.Generator().manual_seed(1))
    scores[..., :2] = float("inf")
    d = sample_eviction(scores, 7, 0.05, torch.Generator().manual_seed(2))
    free = torch.isfinite(scores)
    ref = gumbel_topk((-scores / 0.05).masked_fill(~free, 0.0), 7, free, torch.Generator().manual_seed(2))
    assert torch.equal(d.order, ref) and torch.equal(d.drawable, free)


def test_top_keep_breaks_ties_toward_the_older_entry():
    """Deterministic top-k (every policy's default ``select``) against a plain-Python ranking: the highest scores
    are kept and, among equal scores, the older entry (lower index); ``torch.topk`` breaks such ties differently on
    CPU and CUDA, which made ``lazy`` (integer-valued state, many ties) device-dependent."""
    gen = torch.Generator().manual_seed(0)
    for c in (7, 40, 300, 2048):
        scores = torch.randint(0, 4, (2, 3, c), generator=gen).float()
        scores[0, 0, :3] = float("inf")  # protected entries and padding take part like any score
        scores[1, 2, -2:] = float("-inf")
        k = c // 2 + 1
        keep = top_keep(scores, k)
        assert keep.shape == (2, 3, k)
        for b in range(2):
            for h in range(3):
                row = scores[b, h].tolist()
                want = sorted(sorted(range(c), key=lambda i: (-row[i], i))[:k])
                assert sorted(keep[b, h].tolist()) == want
    from foresight.policies.base import EvictionPolicy
    tied = torch.zeros(1, 1, 10)
    assert sorted(EvictionPolicy.select(None, tied, 4, None).tolist()[0][0]) == [0, 1, 2, 3]
