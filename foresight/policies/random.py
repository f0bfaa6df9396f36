"""Uniform random eviction: the sanity floor any useful policy must beat."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foresight.policies.base import EvictionPolicy, check_seed
from foresight.policies.registry import register_policy
from foresight.sampling import layer_generators


@register_policy
@dataclass
class RandomPolicy(EvictionPolicy):
    """Score candidates uniformly at random (seeded, so runs are reproducible).

    Parameters
    ----------
    seed
        Seed of the policy's generators, one per layer (:func:`~foresight.sampling.layer_generators`), re-applied
        at every :meth:`reset`.
    """

    name = "random"
    per_layer = True
    seed: int = 0

    def __post_init__(self):
        check_seed(self.seed)

    def reset(self, batch_size, num_layers, device, **meta):
        self._gens = layer_generators(self.seed, num_layers)

    def score(self, view):
        b, h = view.keys.shape[:2]
        return torch.rand((b, h, view.num_candidates), generator=self._gens[view.layer_idx]).to(view.keys.device)
