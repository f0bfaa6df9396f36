"""Full cache: never evict (the reference every other policy is measured against)."""

from __future__ import annotations

from dataclasses import dataclass

from foresight.policies.base import EvictionPolicy
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class FullPolicy(EvictionPolicy):
    """Keep every entry; the budget is ignored."""

    name = "full"
    per_layer = True
    evicts = False
    selects_rows = True  # no per-row state

    def score(self, view):  # pragma: no cover - never called
        raise RuntimeError("the full policy never evicts")
