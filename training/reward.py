"""What an eviction episode costs: the GRPO reward and its advantages (docs/training.md, GRPO).

* **Scored positions** (:func:`reward_positions`): next-token positions ``>= B + W``, minus the 20% with the
  highest full-cache entropy (penalise only confident tokens).
* **Episode reward** (:func:`episode_rewards`): ``delta = CE_evicted - CE_full`` per scored position,
  ``R = -mean(delta^2 * 1[delta > eta])`` (``reward="jump"``, the method: penalise only large loss jumps of
  confident tokens, the ones that derail a generation), or ``R = -mean(delta)`` (``reward="delta"``: every
  position's loss change, i.e. the fidelity loss ratio's own numerator, which the quality benchmark measures).
* **Advantages**: ``episode`` (:func:`group_advantages`): ``A = (R - mean_G) / (std_G + eps)`` within the group
  of ``G`` rollouts of one trace, one number for every action of a rollout. ``per_event``
  (:func:`per_event_advantages`): the reward-to-go of event ``e`` is the same penalty over the scored
  positions at or after the token where ``e`` fired (the only ones its evictions can have changed),
  ``R_e = -mean_{p scored, p >= end_e}(delta_p^2 * 1[delta_p > eta])``, normalised across the group at the
  same ``e``; an event with no scored position after it gets advantage 0.
* :func:`loss_ratio`: summed CE under eviction and with the full cache (the fidelity loss ratio's parts).

Shapes: ``ce_evicted`` (G, N-1) per-rollout next-token CE, ``ce_full`` and ``entropy_full`` (N-1,),
``positions`` bool (N-1,); ``ends`` the number of tokens fed when each event fired (index ``end`` of the
(N-1,) arrays is the first prediction made after it).
"""

from __future__ import annotations

import math

import torch

#: Per-position penalties of :func:`penalties`: ``jump`` (the method) or ``delta`` (the loss ratio's numerator).
REWARDS = ("jump", "delta")


def reward_positions(entropy_full: torch.Tensor, start: int, drop_frac: float = 0.2) -> torch.Tensor:
    """Bool (N-1,) mask of the positions that count for the reward: ``i >= start`` with a finite entropy,
    minus the ``floor(drop_frac * n)`` of them with the highest full-cache entropy (ties: later positions go)."""
    ent = entropy_full.float()
    idx = torch.arange(ent.shape[-1])
    ok = (idx >= start) & torch.isfinite(ent)
    n = int(ok.sum())
    drop = int(math.floor(drop_frac * n))
    if drop > 0:
        cand = idx[ok]
        order = torch.argsort(ent[ok], stable=True, descending=True)
        ok = ok.clone()
        ok[cand[order[:drop]]] = False
    return ok


def penalties(ce_evicted: torch.Tensor, ce_full: torch.Tensor, eta: float = 1.5, reward: str = "jump") -> torch.Tensor:
    """Per rollout and position, (G, N-1) fp64: ``delta^2 * 1[delta > eta]`` (``jump``) or ``delta`` itself
    (``delta``; negative where the evicted cache predicts better), ``delta = CE_evicted - CE_full``."""
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
    delta = ce_evicted.double() - ce_full.double()[None]
    if reward == "delta":
        return delta
    return torch.where(delta > eta, delta * delta, torch.zeros_like(delta))


def episode_rewards(ce_evicted: torch.Tensor, ce_full: torch.Tensor, positions: torch.Tensor,
                    eta: float = 1.5, reward: str = "jump") -> torch.Tensor:
    """R = -mean over ``positions`` of the :func:`penalties` (``delta^2 * 1[delta > eta]`` by default).

    ``ce_evicted`` (G, N-1), ``ce_full`` (N-1,), ``positions`` bool (N-1,). Returns (G,) fp32 (summed in fp64).
    """
    if int(positions.sum()) == 0:
        return torch.zeros(ce_evicted.shape[0])
    pen = penalties(ce_evicted[:, positions], ce_full[positions], eta, reward)
    return (-pen.mean(-1)).float()


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """``(R - mean) / (std + eps)`` within the last dim (the group), unbiased std as in TRL's GRPOTrainer."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True) if rewards.shape[-1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


def event_rewards(ce_evicted: torch.Tensor, ce_full: torch.Tensor, positions: torch.Tensor, ends: list[int],
                  eta: float = 1.5, reward: str = "jump") -> tuple[torch.Tensor, torch.Tensor]:
    """Reward-to-go (G, E) of each event (mean penalty over the scored positions ``>= end``, negated) and a
    bool (E,) mask of the events that have any scored position after them (the others get reward 0)."""
    pen = penalties(ce_evicted, ce_full, eta, reward)
    pen = torch.where(positions[None], pen, torch.zeros_like(pen))  # (G, N-1), 0 off the scored positions
    to_go = torch.flip(torch.cumsum(torch.flip(pen, [-1]), -1), [-1])  # sum over p >= i
    count = torch.flip(torch.cumsum(torch.flip(positions.long(), [0]), 0), [0])
    n = pen.shape[-1]
    idx = torch.tensor([min(int(e), n) for e in ends], dtype=torch.long)
    to_go = torch.cat([to_go, to_go.new_zeros(to_go.shape[0], 1)], -1)[:, idx]  # end == N-1: nothing after
    count = torch.cat([count, count.new_zeros(1)])[idx]
    has = count > 0
    return (-to_go / count.clamp(min=1)).float(), has


def per_event_advantages(ce_evicted: torch.Tensor, ce_full: torch.Tensor, positions: torch.Tensor, ends: list[int],
                         eta: float = 1.5, eps: float = 1e-4, reward: str = "jump") -> torch.Tensor:
    """Per-event reward-to-go advantages (G, E), normalised across the group at each event; 0 where the event
    has no scored position after it."""
    r, has = event_rewards(ce_evicted, ce_full, positions, ends, eta, reward)
    adv = group_advantages(r.T, eps).T
    return torch.where(has[None], adv, torch.zeros_like(adv)).float()


def loss_ratio(ce: torch.Tensor, ce_full: torch.Tensor, start: int) -> tuple[float, float]:
    """Summed CE_evicted and CE_full over positions >= ``start`` (the fidelity loss ratio's numerator/denominator)."""
    sl = slice(start, None)
    ok = torch.isfinite(ce[..., sl]) & torch.isfinite(ce_full[sl])
    return float(ce[..., sl][ok].double().sum()), float(ce_full[sl].expand_as(ce[..., sl])[ok].double().sum())


__all__ = ["REWARDS", "episode_rewards", "event_rewards", "group_advantages", "loss_ratio", "penalties",
           "per_event_advantages", "reward_positions"]
