"""Per-event reward-to-go advantages against a hand-computed example; the episode-level mode is unchanged."""

from __future__ import annotations

import pytest
import torch

import foresight
from foresight.runtime import replay
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model
from training.grpo import grpo_loss
from training.reward import event_rewards, group_advantages, per_event_advantages, reward_positions
from training.rollout import Rollout, action_advantages, collect_rollouts


def _example():
    # 6 predictions, scored positions 1..4 (0 before B+W, 5 dropped); eta = 1.5, penalty delta^2 if delta > 1.5
    ce_full = torch.zeros(6)
    positions = torch.tensor([False, True, True, True, True, False])
    ce = torch.tensor([
        [9.0, 2.0, 0.0, 0.0, 3.0, 9.0],  # penalties at 1..4: 4, 0, 0, 9
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # none
        [0.0, 0.0, 2.0, 0.0, 0.0, 0.0],  # 0, 4, 0, 0
    ])
    ends = [1, 3, 5]  # events fired after 1, 3 and 5 tokens: they can change predictions >= 1, >= 3, >= 5
    return ce, ce_full, positions, ends


def test_event_rewards_by_hand():
    ce, ce_full, positions, ends = _example()
    r, has = event_rewards(ce, ce_full, positions, ends, eta=1.5)
    # event 0 (positions 1..4): -(4+0+0+9)/4, 0, -(0+4+0+0)/4; event 1 (positions 3, 4): -(0+9)/2, 0, 0;
    # event 2: no scored position after it
    torch.testing.assert_close(r, torch.tensor([[-13 / 4, -9 / 2, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]))
    assert has.tolist() == [True, True, False]


def test_per_event_advantages_by_hand():
    ce, ce_full, positions, ends = _example()
    a = per_event_advantages(ce, ce_full, positions, ends, eta=1.5, eps=0.0)
    # event 0: R = (-3.25, 0, -1), mean -1.4167, unbiased std 1.6646
    r0 = torch.tensor([-3.25, 0.0, -1.0])
    m0, s0 = -4.25 / 3, ((r0 + 4.25 / 3) ** 2).sum().div(2).sqrt()
    # event 1: R = (-4.5, 0, 0), mean -1.5, std sqrt((9 + 2.25 + 2.25) / 2) = sqrt(6.75)
    expected = torch.tensor([
        [(-3.25 - m0) / s0, -3.0 / 6.75 ** 0.5, 0.0],
        [(0.0 - m0) / s0, 1.5 / 6.75 ** 0.5, 0.0],
        [(-1.0 - m0) / s0, 1.5 / 6.75 ** 0.5, 0.0],
    ])
    torch.testing.assert_close(a, expected, atol=1e-6, rtol=1e-6)
    assert a[0, 0] == pytest.approx(-1.1014, abs=1e-4) and a[0, 1] == pytest.approx(-1.1547, abs=1e-4)


def test_event_rewards_with_the_delta_reward_by_hand():
    ce, ce_full, positions, ends = _example()
    r, has = event_rewards(ce, ce_full, positions, ends, reward="delta")
    # deltas at 1..4: row 0 (2, 0, 0, 3), row 1 zeros, row 2 (0, 2, 0, 0); event 0 sees all four, event 1 two
    torch.testing.assert_close(r, torch.tensor([[-5 / 4, -3 / 2, 0.0], [0.0, 0.0, 0.0], [-2 / 4, 0.0, 0.0]]))
    assert has.tolist() == [True, True, False]


def _rollout(adv, e=3, num_layers=2, g=3, h=2):
    z = torch.zeros(e, num_layers, g, h)
    return Rollout("t", None, None, None, z, torch.ones(e, dtype=torch.bool), torch.zeros(g, 6), torch.zeros(g), adv)


def test_action_advantages_follow_the_action_order():
    """(G, E) advantages expand to the (G, E*L*Hkv) order of flat_actions: every (layer, head) of event e
    gets event e's advantage."""
    adv = torch.arange(9.0).reshape(3, 3)
    flat = action_advantages(_rollout(adv))
    assert flat.shape == (3, 3 * 2 * 2)
    assert torch.equal(flat.reshape(3, 3, 4), adv[:, :, None].expand(3, 3, 4))
    episode = torch.tensor([1.0, -1.0, 0.0])
    assert torch.equal(action_advantages(_rollout(episode)), episode)  # episode mode: passed through as is


def test_episode_mode_unchanged_and_per_action_advantages_in_the_loss():
    lp = torch.randn(3, 4, requires_grad=True)
    adv = group_advantages(torch.tensor([0.0, -1.0, -3.0]))
    loss_ep, _ = grpo_loss(lp, lp.detach(), None, adv, None, 0.2, 0.0)
    (g_ep,) = torch.autograd.grad(loss_ep, lp)
    torch.testing.assert_close(g_ep, (-adv[:, None] / 4 / 3).expand(3, 4))  # REINFORCE at ratio 1, as before
    # the same advantages given per action are the same loss
    loss_pa, _ = grpo_loss(lp, lp.detach(), None, adv[:, None].expand(3, 4), None, 0.2, 0.0)
    torch.testing.assert_close(loss_pa, loss_ep)
    per_action = torch.randn(3, 4)
    (g_pa,) = torch.autograd.grad(grpo_loss(lp, lp.detach(), None, per_action, None, 0.2, 0.0)[0], lp)
    torch.testing.assert_close(g_pa, -per_action / 4 / 3)


def test_per_event_rollouts_through_the_runtime():
    """collect_rollouts(advantage="per_event"): (G, E) advantages; the first event sees every scored position, so
    its advantages are the episode-level ones; events after the last scored token get 0."""
    b, w = 16, 4
    model, _ = get_model("tiny-llama")
    sc = Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=b, interval=w, hidden=8), seed=4)
    ids = torch.randint(3, 200, (41,), generator=torch.Generator().manual_seed(0)).tolist()
    full = replay(model, [ids], "full", None, w)
    pos = reward_positions(full.entropy[0], b + w, 0.2)
    kw = dict(temperature=0.5, seed=7, positions=pos, ce_full=full.ce[0], eta=0.0)
    ep = collect_rollouts(model, sc, ids, 3, b, w, **kw)
    pe = collect_rollouts(model, sc, ids, 3, b, w, advantage="per_event", **kw)
    assert torch.equal(ep.order, pe.order) and torch.equal(ep.rewards, pe.rewards)  # same draws, same rewards
    assert ep.advantages.shape == (3,) and pe.advantages.shape == (3, ep.logp_old.shape[0])
    torch.testing.assert_close(pe.advantages[:, 0], ep.advantages, atol=1e-5, rtol=1e-5)
    assert not bool(pe.event_mask[-1]) and torch.equal(pe.advantages[:, -1], torch.zeros(3))


def test_advantage_signal_metrics():
    lp = torch.zeros(3, 4)
    mask = torch.tensor([True, True, True, False])
    _, m = grpo_loss(lp, lp, None, torch.tensor([[2.0, 0.0, 0.0, 9.0], [0.0, -1.0, 0.0, 9.0], [0.0] * 4]), mask,
                     0.2, 0.0)
    assert m["adv_nonzero_frac"] == pytest.approx(2 / 9) and m["adv_abs_mean"] == pytest.approx(3 / 9)
