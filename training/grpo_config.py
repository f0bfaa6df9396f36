"""The keys of ``foresight train grpo`` (``configs/grpo.yaml``), validated on construction, and the KL schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from training.reward import REWARDS
from training.refine_config import RefinementConfig

ADVANTAGES = ("episode", "per_event")


@dataclass
class GRPOConfig(RefinementConfig):
    """Keys of ``configs/grpo.yaml`` (documented there); validated on construction."""

    RUN_CONTROL: ClassVar[frozenset] = RefinementConfig.RUN_CONTROL | {  # paths: by content, see GRPOTask
        "ref_scorer", "eval_group_size", "eval_seed"}

    out_dir: str = "runs/grpo"
    steps: int = 250
    lr: float = 3e-4
    warmup_steps: int = 0
    ref_scorer: str | None = None
    budget: int | None = None
    interval: int | None = None
    group_size: int = 8
    temperature: float = 0.003  # matched to the SL hinge margin 0.01 (docs/training.md, "GRPO")
    inner_epochs: int = 1
    clip_eps: float = 0.2
    beta: float = 0.05
    beta_final: float = 0.005
    beta_decay_steps: int = 0
    reward: str = "jump"
    eta: float = 1.5
    drop_entropy_frac: float = 0.2
    adv_eps: float = 1e-4
    advantage: str = "episode"
    eval_group_size: int = 0
    eval_seed: int = 12345

    def __post_init__(self):
        super().__post_init__()
        if (self.budget is None) != (self.interval is None):
            raise ValueError("set both budget and interval, or neither (then the scorer's are used)")
        if self.budget is not None and not 0 < self.interval < self.budget:
            raise ValueError(f"need 0 < interval < budget, got {self.interval}, {self.budget}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (advantages are normalised within a group), got {self.group_size}")
        if self.inner_epochs < 1:
            raise ValueError(f"inner_epochs must be >= 1, got {self.inner_epochs}")
        for name in ("checkpoint_every", "max_steps_per_run", "steps"):
            v = int(getattr(self, name))
            if v % self.inner_epochs:
                raise ValueError(f"{name} ({v}) must be a multiple of inner_epochs ({self.inner_epochs}) so "
                                 "checkpoints and resumes fall on rollout boundaries")
        if not self.temperature > 0 or not self.clip_eps > 0 or self.adv_eps <= 0:
            raise ValueError("temperature, clip_eps and adv_eps must be > 0")
        if self.beta < 0 or self.beta_final < 0 or self.beta_decay_steps < 0:
            raise ValueError("beta, beta_final and beta_decay_steps must be >= 0")
        if not 0 <= self.drop_entropy_frac < 1:
            raise ValueError(f"drop_entropy_frac must be in [0, 1), got {self.drop_entropy_frac}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage must be one of {', '.join(ADVANTAGES)}, got {self.advantage!r}")
        if self.eval_group_size == 1 or self.eval_group_size < 0:
            raise ValueError("eval_group_size must be 0 (= group_size) or >= 2")


def beta_at(step: int, cfg: GRPOConfig) -> float:
    """KL weight at ``step``: cosine decay from ``beta`` to ``beta_final`` over ``beta_decay_steps`` (0: all)."""
    span = cfg.beta_decay_steps or cfg.steps
    p = min(1.0, step / max(1, span))
    return cfg.beta_final + (cfg.beta - cfg.beta_final) * 0.5 * (1.0 + math.cos(math.pi * p))


__all__ = ["ADVANTAGES", "GRPOConfig", "beta_at"]
