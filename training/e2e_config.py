"""The keys of ``foresight train e2e`` (``configs/e2e.yaml``, documented there), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from training.refine_config import RefinementConfig

OBJECTIVES = ("ce", "kl")


@dataclass
class E2EConfig(RefinementConfig):
    """Keys of ``configs/e2e.yaml`` (documented there); validated on construction."""

    out_dir: str = "runs/e2e"
    steps: int = 100
    lr: float = 1e-4
    warmup_steps: int = 0
    max_tokens: int = 0
    tau: float = 0.01
    objective: str = "ce"

    def __post_init__(self):
        super().__post_init__()
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0 (the relaxation's temperature), got {self.tau}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0 = whole traces), got {self.max_tokens}")


__all__ = ["E2EConfig", "OBJECTIVES"]
