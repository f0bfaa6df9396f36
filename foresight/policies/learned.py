"""The learned policy: the ForesightKV scorer over the shared feature extractor (DESIGN.md section 4).

Features come from :class:`foresight.features.FeatureExtractor` (the same object type the distillation
replay uses), scores from :class:`foresight.scorer.Scorer` (higher = keep).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from foresight.views import EvictView, StepView
from foresight.policies.base import EvictionPolicy, check_range
from foresight.policies.registry import register_policy

SELECTIONS = ("topk", "sample")


def sample_keep(scores: torch.Tensor, num_keep: int, pool: int, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample an eviction set and return the kept indices (..., num_keep).

    The ``C - num_keep`` evicted candidates are drawn without replacement from the ``pool`` most evictable
    candidates (lowest keep score) with probabilities ``softmax(-scores / temperature)`` (Plackett-Luce),
    via the Gumbel-top-k trick. Entries scored ``-inf`` (padding) are evicted first, ``+inf`` (sinks) never
    unless the pool leaves no choice.
    """
    c = scores.shape[-1]
    n_evict = c - num_keep
    if n_evict <= 0:
        return torch.arange(c, device=scores.device).expand(*scores.shape[:-1], c)
    logits = -scores.float() / temperature
    pool = max(min(pool, c), n_evict)
    pool_idx = logits.topk(pool, dim=-1).indices
    pool_logits = logits.gather(-1, pool_idx)
    u = torch.rand(pool_logits.shape, generator=generator, device="cpu").to(scores.device)
    gumbel = -torch.log(-torch.log(u.clamp(1e-12, 1 - 1e-12)))
    chosen = pool_idx.gather(-1, (pool_logits + gumbel).topk(n_evict, dim=-1).indices)
    evicted = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, chosen, True)
    return (~evicted).float().topk(num_keep, dim=-1).indices


@register_policy
@dataclass
class LearnedPolicy(EvictionPolicy):
    """The distilled ForesightKV scorer (``--policy-arg scorer=DIR``).

    Parameters
    ----------
    scorer
        A scorer directory (``foresight train sl`` output) or a :class:`~foresight.scorer.Scorer`.
    selection
        ``topk``: keep the highest scores (deterministic). ``sample``: sample the evicted set without
        replacement from the ``2 W`` lowest-scoring candidates by ``softmax(-score / temperature)``.
    temperature
        Softmax temperature of ``sample``.
    seed
        Seed of the sampling generator, re-applied at every reset.
    """

    name: ClassVar[str] = "learned"
    observes: ClassVar[bool] = True
    scorer: Any = None
    selection: str = "topk"
    temperature: float = 1.0
    seed: int = 0
    _scorer: Any = field(default=None, init=False, repr=False)
    _extractor: Any = field(default=None, init=False, repr=False)
    _gen: Any = field(default=None, init=False, repr=False)
    on_features: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        from foresight.errors import ForesightError
        from foresight.scorer import Scorer

        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        check_range("temperature", self.temperature, 1e-6)
        if self.scorer is None:
            raise ForesightError("the learned policy needs a scorer: --policy-arg scorer=DIR")
        self._scorer = self.scorer if isinstance(self.scorer, Scorer) else Scorer.from_pretrained(Path(self.scorer))
        self._scorer.eval()
        self._extractor = self._scorer.config.extractor()

    @property
    def extractor(self):
        return self._extractor

    @property
    def model(self):
        return self._scorer

    def config(self) -> dict:
        cfg = super().config()
        cfg["scorer"] = str(self.scorer) if not hasattr(self.scorer, "config") else "<in-memory>"
        cfg.pop("on_features", None)
        return cfg

    def reset(self, batch_size, num_layers, device, num_groups: int = 1, fingerprint=None, **meta):
        if fingerprint is not None:  # the runtime passes the model's fingerprint: same check as every loader
            self._scorer.check_compatible(fingerprint)
        self._scorer.check_shape(num_layers, num_groups=num_groups)
        self._scorer.to(device)
        self._extractor.reset(num_layers, num_groups)
        self._gen = torch.Generator().manual_seed(self.seed)

    def observe(self, view: StepView) -> None:
        self._extractor.observe(view)

    @torch.no_grad()
    def score(self, view: EvictView) -> torch.Tensor:
        if view.layer_idx == 0:
            self._scorer.check_shape(self._scorer.config.num_layers, view.keys.shape[1], None, view.keys.shape[-1])
        feats = self._extractor.features(view)
        if self.on_features is not None:
            self.on_features(view, feats)
        scores = self._scorer(feats, layer_idx=view.layer_idx)
        live = view.valid[..., : view.num_candidates]
        if not bool(torch.isfinite(scores).masked_fill(~live, True).all()):
            from foresight.errors import ForesightError

            raise ForesightError(
                f"scorer {self._scorer.source or '(in memory)'} produced NaN/Inf scores at event {view.event}, "
                f"layer {view.layer_idx}; ranking them would evict arbitrary entries (check its weights and "
                "feature_mean/feature_std, or retrain it)"
            )
        return scores

    def select(self, scores, num_keep, view):
        if self.selection == "topk":
            return super().select(scores, num_keep, view)
        pool = 2 * (scores.shape[-1] - num_keep)
        return sample_keep(scores, num_keep, pool, self.temperature, self._gen)

    def on_evict(self, layer_idx, keep):
        self._extractor.on_evict(layer_idx, keep)
