"""The keys shared by the trainers that refine a scorer on traces alone (``train grpo``, ``train e2e``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from training.trainer_config import TrainerConfig, check_heldout


@dataclass
class RefinementConfig(TrainerConfig):
    """A trained scorer (``init_scorer``) refined by replaying ``traces`` of ``model``, with problems held out for
    evaluation; validated on construction. The subclasses add their objective's keys."""

    RUN_CONTROL: ClassVar[frozenset] = TrainerConfig.RUN_CONTROL | {  # paths: by content, see each task's data
        "traces", "init_scorer", "eval_before", "eval_traces"}

    micro_batch: int = 1
    checkpoint_every: int = 25
    log_every: int = 1
    model: str = "smollm2-135m"
    dtype: str | None = None
    traces: str | list[str] = ""
    init_scorer: str = ""
    max_traces: int = 0
    heldout: float = 0.25
    split_seed: int = 0
    eval_before: bool = True
    eval_traces: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not self.traces or not self.init_scorer:
            raise ValueError("set `traces` (a `foresight trace` directory) and `init_scorer` (a scorer directory or "
                             "a shipped scorer's name, e.g. smollm2-135m-b64-w16)")
        check_heldout(self.heldout)
        for name in ("max_traces", "eval_traces"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = all), got {getattr(self, name)}")


__all__ = ["RefinementConfig"]
