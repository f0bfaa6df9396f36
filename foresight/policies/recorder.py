"""Record learned-scorer features along another policy's eviction trajectory.

:class:`FeatureRecorder` wraps a *driver* policy (the ``golden`` replay for distillation, a sampled scorer for
GRPO rollouts, anything in tests): the driver decides what is evicted, while a
:class:`~foresight.features.FeatureExtractor` observes the same steps and, at every event, builds the features
the ``learned`` policy would see for that cache state and hands them to ``on_event``. It is not registered
(it needs live objects, not hyperparameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

from foresight.views import EvictView, StepView
from foresight.policies.base import EvictionPolicy

EventHook = Callable[[EvictView, torch.Tensor], None]


@dataclass
class FeatureRecorder(EvictionPolicy):
    """Drive evictions with ``driver`` while ``extractor`` computes features at each event.

    Parameters
    ----------
    extractor
        A :class:`~foresight.features.FeatureExtractor` (e.g. ``ScorerConfig.extractor()``).
    driver
        The policy whose scores/selection decide the evictions.
    on_event
        ``f(view, features)`` with the layer's (batch, Hkv, C, D) candidate features, before eviction.
    """

    name: ClassVar[str] = "feature_recorder"
    observes: ClassVar[bool] = True
    extractor: Any = None
    driver: Any = None
    on_event: EventHook | None = None

    def __post_init__(self):
        if self.extractor is None or self.driver is None:
            raise ValueError("FeatureRecorder needs an extractor and a driver policy")

    @property
    def replay_only(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.driver, "replay_only", False))

    @property
    def per_layer(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.driver, "per_layer", False))  # the extractor keeps per-layer state only

    def reset(self, batch_size, num_layers, device, num_groups: int = 1, **meta):
        self.extractor.reset(num_layers, num_groups)
        self.driver.reset(batch_size, num_layers, device, num_groups=num_groups, **meta)

    def observe(self, view: StepView) -> None:
        self.extractor.observe(view)
        if getattr(self.driver, "observes", False):
            self.driver.observe(view)

    def score(self, view: EvictView) -> torch.Tensor:
        feats = self.extractor.features(view)
        if self.on_event is not None:
            self.on_event(view, feats)
        return self.driver.score(view)

    def select(self, scores, num_keep, view):
        return self.driver.select(scores, num_keep, view)

    def on_evict(self, layer_idx, keep):
        self.extractor.on_evict(layer_idx, keep)
        self.driver.on_evict(layer_idx, keep)

    def end_event(self):
        self.driver.end_event()

    def config(self) -> dict:
        return {"driver": getattr(self.driver, "name", "?")}
