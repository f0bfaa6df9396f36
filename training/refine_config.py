"""The keys shared by the trainers that refine a scorer on traces alone (``train grpo``, ``train e2e``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from training.trainer_config import TracesConfig


@dataclass
class RefinementConfig(TracesConfig):
    """A trained scorer (``init_scorer``) refined by replaying ``traces`` of ``model``, with problems held out for
    evaluation; validated on construction. The subclasses add their objective's keys."""

    RUN_CONTROL: ClassVar[frozenset] = TracesConfig.RUN_CONTROL | {  # init_scorer: by content, see each task's data
        "init_scorer", "eval_before", "eval_traces"}

    micro_batch: int = 1
    checkpoint_every: int = 25
    log_every: int = 1
    init_scorer: str = ""
    eval_before: bool = True
    eval_traces: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not self.traces or not self.init_scorer:
            raise ValueError("set `traces` (a `foresight trace` directory) and `init_scorer` (a scorer directory or "
                             "a shipped scorer's name, e.g. smollm2-135m-b64-w16)")
        if self.eval_traces < 0:
            raise ValueError(f"eval_traces must be >= 0 (0 = all), got {self.eval_traces}")


__all__ = ["RefinementConfig"]
