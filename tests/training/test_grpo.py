"""GRPO trainer: reward, advantages, the clipped objective vs REINFORCE, rollouts through the runtime, config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import foresight
from foresight.policies.base import EvictionPolicy
from foresight.runtime import replay
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model
from foresight.sampling import gumbel_topk, log_prob
from training.grpo import grpo_loss
from training.grpo_config import GRPOConfig, beta_at
from training.reward import episode_rewards, group_advantages, loss_ratio, reward_positions
from training.rollout import collect_rollouts, event_ends, rollout_log_probs

B, W = 16, 4


def _scorer(model, seed=0) -> Scorer:
    return Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8), seed=seed)


# ---------------------------------------------------------------------------------------------------------------
# Reward and advantages
# ---------------------------------------------------------------------------------------------------------------


def test_reward_positions_start_and_entropy_drop():
    ent = torch.tensor([9.0, 9.0, 0.1, 0.5, 3.0, 0.2, 2.0, 0.3, 0.4, 1.0, 0.6, float("nan")])
    pos = reward_positions(ent, start=2, drop_frac=0.2)
    # scored positions 2..10 (9 of them, position 11 has no next token); floor(0.2*9)=1 dropped: the 3.0 at 4
    assert pos.tolist() == [False, False, True, True, False, True, True, True, True, True, True, False]
    pos = reward_positions(ent, start=2, drop_frac=0.3)  # floor(2.7)=2 dropped: 3.0 and 2.0
    assert not pos[4] and not pos[6] and int(pos.sum()) == 7
    assert int(reward_positions(ent, start=2, drop_frac=0.0).sum()) == 9


def test_episode_rewards_penalise_only_large_jumps():
    ce_full = torch.tensor([1.0, 1.0, 1.0, 1.0, 5.0])
    positions = torch.tensor([False, True, True, True, True])
    ce = torch.tensor([
        [9.0, 1.0, 1.0, 1.0, 5.0],  # only an unscored position differs -> 0
        [1.0, 2.4, 0.0, 1.0, 5.0],  # delta 1.4 <= eta, negative deltas never count -> 0
        [1.0, 3.0, 1.0, 1.0, 5.0],  # delta 2.0 > eta at one of 4 positions -> -(4/4) = -1
        [1.0, 3.0, 4.0, 1.0, 2.0],  # deltas 2 and 3 -> -(4 + 9)/4
    ])
    r = episode_rewards(ce, ce_full, positions, eta=1.5)
    torch.testing.assert_close(r, torch.tensor([0.0, 0.0, -1.0, -13.0 / 4]))


def test_delta_reward_is_minus_the_mean_loss_change_and_its_sums_give_the_loss_ratio():
    ce_full = torch.tensor([1.0, 1.0, 1.0, 1.0, 5.0])
    positions = torch.tensor([False, True, True, True, True])
    ce = torch.tensor([
        [9.0, 1.0, 1.0, 1.0, 5.0],  # only an unscored position differs -> 0
        [1.0, 2.4, 0.0, 1.0, 5.0],  # small and negative changes count: -(1.4 - 1) / 4
        [1.0, 3.0, 4.0, 1.0, 2.0],  # -(2 + 3 - 3) / 4
    ])
    r = episode_rewards(ce, ce_full, positions, reward="delta")
    torch.testing.assert_close(r, torch.tensor([0.0, -0.1, -0.5]))
    # with every position >= start scored, -R * n / sum(CE_full) is the loss ratio minus one
    num, den = loss_ratio(ce[2], ce_full, start=1)
    assert num / den - 1 == pytest.approx(-float(r[2]) * 4 / float(ce_full[1:].sum()))
    with pytest.raises(ValueError, match="reward must be one of jump, delta"):
        episode_rewards(ce, ce_full, positions, reward="ce")
    with pytest.raises(ValueError, match="reward must be one of"):
        GRPOConfig(traces="t", init_scorer="s", reward="ce")


def test_group_advantages_normalised():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.5, 0.5, 0.5, 0.5]])
    a = group_advantages(r, eps=1e-6)
    torch.testing.assert_close(a[0].mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(a[0].std(), torch.tensor(1.0), atol=1e-4, rtol=0)
    assert torch.equal(a[1], torch.zeros(4))  # identical rewards carry no signal


def test_beta_schedule_decays():
    cfg = GRPOConfig(traces="t", init_scorer="s", steps=100, beta=0.05, beta_final=0.005)
    assert beta_at(0, cfg) == pytest.approx(0.05)
    assert beta_at(50, cfg) == pytest.approx(0.0275)
    assert beta_at(100, cfg) == pytest.approx(0.005)
    assert beta_at(200, cfg) == pytest.approx(0.005)


# ---------------------------------------------------------------------------------------------------------------
# The objective
# ---------------------------------------------------------------------------------------------------------------


def _toy(seed=0, g=4, e=3, c=6, k=2):
    """A toy scorer over random features and sampled draws: (scorer, feats (E, L, G, H, C, D), orders)."""
    model, _ = get_model("tiny-llama")
    sc = _scorer(model, seed=seed)
    L, H, D = sc.config.num_layers, sc.config.num_kv_heads, sc.config.input_dim
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(e, L, g, H, c, D, generator=gen)
    with torch.no_grad():
        logits = -sc(feats.transpose(0, 1)).transpose(0, 1)
    order = gumbel_topk(logits, k, generator=gen)
    return sc, feats, order


def _logp(sc, feats, order):
    return log_prob(-sc(feats.transpose(0, 1)).transpose(0, 1), order)  # (E, L, G, H)


def _flat(t):
    return t.permute(2, 0, 1, 3).reshape(t.shape[2], -1)


@pytest.mark.parametrize("clip_eps", [0.2, 1e9])
def test_one_inner_epoch_gradient_equals_reinforce(clip_eps):
    """ratio = 1 (old = new): the clipped surrogate's gradient is REINFORCE with group-normalised advantages."""
    sc, feats, order = _toy()
    adv = group_advantages(torch.tensor([0.0, -1.0, -0.25, -3.0]))
    with torch.no_grad():
        old = _logp(sc, feats, order)
    loss, metrics = grpo_loss(_flat(_logp(sc, feats, order)), _flat(old), _flat(old), adv, None, clip_eps, beta=0.0)
    grads = torch.autograd.grad(loss, list(sc.parameters()))
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clip_frac"] == 0.0
    # REINFORCE: -(1/G) sum_g A_g * mean_a grad log p_{g,a}
    lp = _flat(_logp(sc, feats, order))
    reinforce = -(adv[:, None] * lp).mean(-1).mean()
    ref = torch.autograd.grad(reinforce, list(sc.parameters()))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert any(float(g.abs().max()) > 0 for g in grads)


def test_clipping_stops_the_gradient_outside_the_trust_region():
    sc, feats, order = _toy(seed=1)
    new = _flat(_logp(sc, feats, order))
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    # old log-probs far below the new ones: ratio >> 1 + eps; positive advantages are clipped (no gradient),
    # negative advantages are not (the pessimistic min keeps the unclipped term)
    old = new.detach() - 1.0
    loss, metrics = grpo_loss(new, old, None, adv, None, 0.2, 0.0)
    assert metrics["clip_frac"] == pytest.approx(1.0)
    lp = _flat(_logp(sc, feats, order))
    per_row = torch.autograd.grad(
        grpo_loss(lp, old, None, torch.tensor([1.0, 0.0, 0.5, 0.0]), None, 0.2, 0.0)[0], list(sc.parameters()))
    assert all(float(g.abs().max()) == 0.0 for g in per_row)
    lp = _flat(_logp(sc, feats, order))
    neg = torch.autograd.grad(
        grpo_loss(lp, old, None, torch.tensor([0.0, -1.0, 0.0, -0.5]), None, 0.2, 0.0)[0], list(sc.parameters()))
    assert any(float(g.abs().max()) > 0 for g in neg)


def test_k3_kl_term():
    sc, feats, order = _toy(seed=2)
    lp = _flat(_logp(sc, feats, order))
    zero_adv = torch.zeros(4)
    loss, m = grpo_loss(lp, lp.detach(), lp.detach(), zero_adv, None, 0.2, beta=0.1)
    assert m["kl_k3"] == pytest.approx(0.0, abs=1e-7) and float(loss.detach()) == pytest.approx(0.0, abs=1e-7)
    ref = lp.detach() + torch.randn(lp.shape, generator=torch.Generator().manual_seed(0))
    loss, m = grpo_loss(lp, lp.detach(), ref, zero_adv, None, 0.2, beta=0.1)
    d = ref - lp.detach()
    assert m["kl_k3"] == pytest.approx(float((d.exp() - d - 1).mean()), rel=1e-5)
    assert float(loss.detach()) == pytest.approx(0.1 * float((d.exp() - d - 1).mean()), rel=1e-5) and m["kl_k3"] > 0


def test_action_mask_excludes_actions():
    lp = torch.randn(3, 5, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.5])
    mask = torch.tensor([True, True, False, False, True])
    loss, _ = grpo_loss(lp, lp.detach(), None, adv, mask, 0.2, 0.0)
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.equal(g[:, ~mask], torch.zeros(3, 2))
    torch.testing.assert_close(g[:, mask], (-adv[:, None] / 3 / 3).expand(3, 3))


# ---------------------------------------------------------------------------------------------------------------
# Rollouts through the runtime
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _ReplayDraws(EvictionPolicy):
    """Evict exactly the recorded draws of one rollout row (to check the records describe what happened)."""

    name: ClassVar[str] = "replay_draws"
    order: torch.Tensor = None  # (E, L, Hkv, W)

    def score(self, view):
        return torch.zeros(view.keys.shape[0], view.keys.shape[1], view.num_candidates)

    def select(self, scores, num_keep, view):
        evicted = torch.zeros(scores.shape, dtype=torch.bool).scatter_(-1, self.order[view.event, view.layer_idx][None], True)
        return (~evicted).float().topk(num_keep, dim=-1).indices


def test_rollouts_record_exact_draws_and_log_probs():
    model, _ = get_model("tiny-llama")
    sc = _scorer(model, seed=4)
    ids = torch.randint(3, 200, (41,), generator=torch.Generator().manual_seed(0)).tolist()
    full = replay(model, [ids], "full", None, W)
    pos = reward_positions(full.entropy[0], B + W, 0.2)
    ro = collect_rollouts(model, sc, ids, 3, B, W, temperature=0.5, seed=7, positions=pos, ce_full=full.ce[0],
                          eta=0.0)
    ends = event_ends(len(ids), B, W)
    E, L, G, H = ro.logp_old.shape
    assert (E, G, H) == (len(ends), 3, sc.config.num_kv_heads) and L == model.config.num_hidden_layers
    assert ro.order.shape[-1] == W and ro.features.shape[-2] == B
    # the last event fires after the last token: it cannot change any scored prediction
    assert ends[-1] == 40 and not bool(ro.event_mask[-1]) and bool(ro.event_mask[:-1].all())
    # the recorded log-probs are the exact PL log-probs of the recorded draws under the same scorer (ratio = 1)
    with torch.no_grad():
        torch.testing.assert_close(rollout_log_probs(sc, ro, 0.5), ro.logp_old, atol=1e-5, rtol=1e-5)
    # rows sample different draws; replaying one row's recorded draws reproduces its CE exactly
    assert not torch.equal(ro.order[:, :, 0], ro.order[:, :, 1])
    for g in range(G):
        res = replay(model, [ids], _ReplayDraws(order=ro.order[:, :, g]), B, W)
        torch.testing.assert_close(res.ce[0], ro.ce[g], equal_nan=True)
    torch.testing.assert_close(ro.rewards, episode_rewards(ro.ce, full.ce[0], pos, 0.0))
    # same seed, same draws
    again = collect_rollouts(model, sc, ids, 3, B, W, 0.5, 7, pos, full.ce[0], 0.0)
    assert torch.equal(again.order, ro.order)


def test_loss_ratio_matches_fidelity_evaluation():
    from evaluation.fidelity import evaluate_fidelity
    from foresight.policies import make_policy

    model, _ = get_model("tiny-llama")
    ids = torch.randint(3, 200, (45,), generator=torch.Generator().manual_seed(1)).tolist()
    pol = make_policy("learned", scorer=_scorer(model, seed=5))
    rec = evaluate_fidelity(model, [ids], [pol], [B], W)[0]
    full = replay(model, [ids], "full", None, W)
    res = replay(model, [ids], make_policy("learned", scorer=_scorer(model, seed=5)), B, W)
    a, b = loss_ratio(res.ce[0], full.ce[0], B + W)
    assert a / b == pytest.approx(rec["loss_ratio"], rel=1e-5)
    # G rollouts pool into one ratio (GRPO's sampled held-out loss ratio): rows sum, the full CE counts G times
    a2, b2 = loss_ratio(torch.stack([res.ce[0], full.ce[0]]), full.ce[0], B + W)
    assert a2 == pytest.approx(a + b, rel=1e-6) and b2 == pytest.approx(2 * b, rel=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [
    {"traces": ""},
    {"traces": []},
    {"traces": ["t", 3]},
    {"init_scorer": ""},
    {"group_size": 1},
    {"inner_epochs": 2, "checkpoint_every": 3},
    {"budget": 16},
    {"budget": 16, "interval": 16},
    {"clip_eps": 0},
    {"drop_entropy_frac": 1.0},
    {"advantage": "per_token"},
    {"nope": 1},
])
def test_config_validation(bad):
    base = {"traces": "t", "init_scorer": "s", "steps": 4, "checkpoint_every": 2}
    with pytest.raises(ValueError):
        GRPOConfig.from_dict({**base, **bad})
    assert GRPOConfig.from_dict({**base, "traces": ["t", "u"]}).traces == ["t", "u"]  # trace sets trained together


def test_grpo_temperature_script_refuses_bad_inputs_in_one_line(tmp_path):
    """benchmarks/grpo_temperature.py ran outside the scripts' contract: a missing scorer or an empty features
    directory was a traceback (exit 1), a temperature of 0 divided by zero."""
    import subprocess
    import sys
    from pathlib import Path

    from foresight.errors import ForesightError
    from tests.conftest import load_script

    model, _ = get_model("tiny-llama")
    Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=16, interval=4, hidden=4), seed=0) \
        .save_pretrained(tmp_path / "scorer")
    (tmp_path / "features").mkdir()
    mod = load_script("grpo_temperature.py")
    for argv, match in (([str(tmp_path / "nothere"), str(tmp_path / "features")], "nothere"),
                        ([str(tmp_path / "scorer"), str(tmp_path / "features")], "features: no feature files"),
                        ([str(tmp_path / "scorer"), str(tmp_path / "features"), "--temperatures", "1,0"], "> 0"),
                        ([str(tmp_path / "scorer"), str(tmp_path / "features"), "--temperatures", "hot"], "'hot'")):
        with pytest.raises(ForesightError, match=match):
            mod.main(argv)
    # a cache of another setting in the same directory (its own key) is not the scorer's: never read
    (tmp_path / "features" / "0123456789abcdef").mkdir()
    (tmp_path / "features" / "0123456789abcdef" / "t.safetensors").write_bytes(b"not read")
    with pytest.raises(ForesightError, match="no feature files of the scorer's model at B=16 W=4"):
        mod.main([str(tmp_path / "scorer"), str(tmp_path / "features")])
    # a scorer whose recent-query window is not W (moved or fine-tuned) never reads the features of W's window
    from training.sl_features import FeatureCache

    fp = foresight.model_fingerprint(model)
    Scorer(ScorerConfig(fp, budget=16, interval=4, hidden=4, window=2), seed=0).save_pretrained(tmp_path / "w2")
    w4 = FeatureCache(tmp_path / "features", fp, 16, 4, 0.9, "float16").dir
    w4.mkdir()
    (w4 / "t.safetensors").write_bytes(b"features of window 4: not read")
    with pytest.raises(ForesightError, match=r"no feature files of the scorer's model at B=16 W=4 \(window 2"):
        mod.main([str(tmp_path / "w2"), str(tmp_path / "features")])
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(repo / "benchmarks" / "grpo_temperature.py"), str(tmp_path / "nothere"),
                           str(tmp_path / "features")], capture_output=True, text=True, cwd=repo, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("grpo_temperature: error:"), proc.stderr
