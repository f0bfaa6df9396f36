"""The keys of ``foresight train e2e`` (``configs/e2e.yaml``, documented there), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from training.trainer_config import TrainerConfig

OBJECTIVES = ("ce", "kl")


@dataclass
class E2EConfig(TrainerConfig):
    """Keys of ``configs/e2e.yaml`` (documented there); validated on construction."""

    RUN_CONTROL: ClassVar[frozenset] = TrainerConfig.RUN_CONTROL | {  # paths: by content, see E2EData
        "traces", "init_scorer", "eval_before", "eval_traces"}

    out_dir: str = "runs/e2e"
    steps: int = 100
    lr: float = 1e-4
    warmup_steps: int = 0
    micro_batch: int = 1
    checkpoint_every: int = 25
    log_every: int = 1
    model: str = "smollm2-135m"
    dtype: str | None = None
    traces: str | list[str] = ""
    init_scorer: str = ""
    max_traces: int = 0
    max_tokens: int = 0
    heldout: float = 0.25
    split_seed: int = 0
    tau: float = 0.01
    objective: str = "ce"
    eval_before: bool = True
    eval_traces: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not self.traces or not self.init_scorer:
            raise ValueError("set `traces` (a `foresight trace` directory) and `init_scorer` (a scorer directory or "
                             "a shipped scorer's name, e.g. smollm2-135m-b64-w16)")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0 (the relaxation's temperature), got {self.tau}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        h = float(self.heldout)
        if not (0 < h < 1 or (h >= 1 and h == int(h))):
            raise ValueError(f"heldout must be a fraction in (0, 1) or a number of problems, got {self.heldout}")
        for name in ("max_traces", "max_tokens", "eval_traces"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = all), got {getattr(self, name)}")

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.init]


__all__ = ["E2EConfig", "OBJECTIVES"]
