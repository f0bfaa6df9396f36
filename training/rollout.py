"""GRPO's rollouts: the ``learned`` policy's sampled evictions, recorded (docs/training.md, GRPO).

* **Policy** (:class:`RolloutPolicy`, a ``learned`` policy with ``selection=sample``): the evicted candidates
  are :func:`foresight.sampling.sample_eviction`'s draw, the very draw the ``learned`` policy makes at
  inference: an ordered Plackett–Luce draw without replacement of ``W`` of the ``C`` candidates with logits
  ``-score / temperature`` over *all* drawable candidates (sinks excluded), sampled with Gumbel-top-k; its exact
  log-probability is :func:`foresight.sampling.log_prob` (see there why the ordered draw).
* **Rollouts** (:func:`collect_rollouts`): the ``G`` rollouts of a trace run as one replay batch of ``G``
  copies, each row with its own Gumbel noise. Per event, layer and head we store the candidates' features (the
  one :class:`~foresight.features.FeatureExtractor`), the drawable mask, the sampled order and its old
  log-probability, so the loss recomputes scores with gradients from exactly the states the rollout saw.
  Rewards and advantages (episode-level or per-event reward-to-go) are :mod:`training.reward`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from foresight.errors import ForesightError
from foresight.policies.learned import LearnedPolicy
from foresight.runtime import replay
from foresight.sampling import eviction_logits, kept_indices, log_prob
from foresight.schedule import replay_schedule
from training.reward import episode_rewards, group_advantages, per_event_advantages


@dataclass
class RolloutPolicy(LearnedPolicy):
    """The ``learned`` policy with sampled evictions that records every draw (not registered).

    Draws exactly as ``learned`` with ``selection=sample`` (:meth:`LearnedPolicy.draw`); records per (event,
    layer): features (batch, Hkv, C, D), drawable mask, order (batch, Hkv, W), log-prob (batch, Hkv).
    """

    name: ClassVar[str] = "grpo_rollout"
    replay_only: ClassVar[bool] = True
    selection: str = "sample"
    records: dict = field(default_factory=dict, init=False, repr=False)
    _pending: Any = field(default=None, init=False, repr=False)

    def __post_init__(self):
        super().__post_init__()
        self.on_features = self._keep_features

    def reset(self, batch_size, num_layers, device, num_groups: int = 1, **meta):
        super().reset(batch_size, num_layers, device, num_groups=num_groups, **meta)
        self.records = {}

    def _keep_features(self, view, feats):
        self._pending = feats

    def select(self, scores, num_keep, view):
        if bool((scores == float("-inf")).any()):
            raise ForesightError("GRPO rollouts replay unpadded traces; got padding candidates (-inf scores)")
        d = self.draw(scores, num_keep, view.layer_idx)
        if int(d.drawable.sum(-1).min()) < d.order.shape[-1]:
            raise ForesightError(f"event {view.event}: fewer drawable candidates than the {d.order.shape[-1]} to "
                                 "evict (protected prompt or sinks fill the cache); GRPO needs a proper draw")
        lp = log_prob(d.logits, d.order, d.drawable)
        self.records[(view.event, view.layer_idx)] = (self._pending, d.drawable, d.order, lp)
        self._pending = None
        return kept_indices(d.order, scores.shape[-1], num_keep)


@dataclass
class Rollout:
    """G rollouts of one trace.

    ``features`` (E, L, G, Hkv, C, D), ``free`` (E, L, G, Hkv, C) bool, ``order`` (E, L, G, Hkv, W),
    ``logp_old`` (E, L, G, Hkv); ``event_mask`` (E,) bool (event can affect a scored token); ``ce`` (G, N-1);
    ``rewards`` (G,); ``advantages`` (G,) episode-level or (G, E) per event; ``logp_ref`` like ``logp_old``
    (filled by the task).
    """

    trace_id: str
    features: torch.Tensor
    free: torch.Tensor
    order: torch.Tensor
    logp_old: torch.Tensor
    event_mask: torch.Tensor
    ce: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    logp_ref: torch.Tensor | None = None

    @property
    def group_size(self) -> int:
        return self.ce.shape[0]


def flat_actions(t: torch.Tensor) -> torch.Tensor:
    """(E, L, G, Hkv) -> (G, E*L*Hkv), the action order of :func:`event_action_mask` and :func:`action_advantages`."""
    return t.permute(2, 0, 1, 3).reshape(t.shape[2], -1)


def event_action_mask(ro: Rollout) -> torch.Tensor:
    """(E*L*Hkv,) bool: the actions of events that can affect a scored token."""
    e, num_layers, _, h = ro.logp_old.shape
    return ro.event_mask[:, None, None].expand(e, num_layers, h).reshape(-1)


def action_advantages(ro: Rollout) -> torch.Tensor:
    """Advantages per rollout (G,) (episode-level), or per rollout and action (G, E*L*Hkv) (per event)."""
    if ro.advantages.dim() == 1:
        return ro.advantages
    e, num_layers, g, h = ro.logp_old.shape
    return ro.advantages[:, :, None, None].expand(g, e, num_layers, h).reshape(g, -1)


def rollout_log_probs(scorer, ro: Rollout, temperature: float) -> torch.Tensor:
    """Log-probabilities (E, L, G, Hkv) of the recorded draws under ``scorer`` (differentiable)."""
    x = ro.features.transpose(0, 1)  # (L, E, G, Hkv, C, D): the scorer's all-layers form
    scores = scorer(x).transpose(0, 1)  # (E, L, G, Hkv, C)
    logits, _ = eviction_logits(scores.masked_fill(~ro.free, float("inf")), temperature)
    return log_prob(logits, ro.order, ro.free)


def event_ends(length: int, budget: int, interval: int) -> list[int]:
    """Tokens appended when each eviction event of a replay of ``length`` tokens fires."""
    return [end for _, end, fire in replay_schedule(length, budget, interval) if fire]


def collect_rollouts(model, scorer, input_ids: list[int], group_size: int, budget: int, interval: int,
                     temperature: float, seed: int, positions: torch.Tensor, ce_full: torch.Tensor, eta: float,
                     adv_eps: float = 1e-4, trace_id: str = "", advantage: str = "episode",
                     reward: str = "jump") -> Rollout:
    """Replay one trace ``group_size`` times with sampled evictions; rewards (``reward``: ``jump`` or ``delta``,
    :func:`training.reward.penalties`) and advantages (``advantage``: ``episode`` or ``per_event``) included."""
    policy = RolloutPolicy(scorer=scorer, temperature=temperature, seed=seed)
    res = replay(model, [list(map(int, input_ids))] * group_size, policy, budget, interval)
    num_layers = model.config.num_hidden_layers
    events = sorted({e for e, _ in policy.records})
    ends = event_ends(len(input_ids), budget, interval)
    if len(events) != len(ends):
        raise ForesightError(f"trace {trace_id!r}: recorded {len(events)} events, the schedule has {len(ends)}")

    def stack(i):
        return torch.stack([torch.stack([policy.records[(e, layer)][i] for layer in range(num_layers)])
                            for e in events]) if events else None

    feats, free, order, lp = (stack(i) for i in range(4))
    scored_after = torch.flip(torch.cumsum(torch.flip(positions.long(), [0]), 0), [0])  # scored positions >= i
    event_mask = torch.tensor([bool(scored_after[end] > 0) if end < len(scored_after) else False for end in ends],
                              dtype=torch.bool)
    rewards = episode_rewards(res.ce, ce_full, positions, eta, reward)
    if advantage == "per_event":
        adv = per_event_advantages(res.ce, ce_full, positions, ends, eta, adv_eps, reward)
    else:
        adv = group_advantages(rewards, adv_eps)
    return Rollout(trace_id, feats, free, order, lp, event_mask, res.ce, rewards, adv)


__all__ = ["Rollout", "RolloutPolicy", "action_advantages", "collect_rollouts", "event_action_mask", "event_ends",
           "flat_actions", "rollout_log_probs"]
