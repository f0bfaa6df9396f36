"""Uniform random eviction: the sanity floor any useful policy must beat."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foresight.policies.base import EvictionPolicy, check_seed
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class RandomPolicy(EvictionPolicy):
    """Score candidates uniformly at random (seeded, so runs are reproducible).

    Parameters
    ----------
    seed
        Seed of the policy's own generator, re-applied at every :meth:`reset`.
    """

    name = "random"
    seed: int = 0

    def __post_init__(self):
        check_seed(self.seed)

    def reset(self, batch_size, num_layers, device, **meta):
        self._gen = torch.Generator(device="cpu").manual_seed(self.seed)

    def score(self, view):
        b, h = view.keys.shape[:2]
        return torch.rand((b, h, view.num_candidates), generator=self._gen).to(view.keys.device)
