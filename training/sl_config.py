"""The settings of ``foresight train sl`` (keys of ``configs/sl.yaml``, documented there), validated on
construction so that a typo fails before a model is loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from foresight.features import check_feature_set
from foresight.policies.registry import check_policy_names
from foresight.scorer import Scorer
from training.trainer_config import TracesConfig
from training.ranking import PAIR_WEIGHTS
from training.sl_features import FEATURE_CACHE_GROUPS


@dataclass
class SLConfig(TracesConfig):
    """Keys of ``configs/sl.yaml`` (documented there); validated on construction."""

    RUN_CONTROL: ClassVar[frozenset] = TracesConfig.RUN_CONTROL | {  # labels: by content, see SLTask
        "labels", "feature_cache", "feature_cache_groups", "replay_batch_size", "eval_max_rows", "eval_fidelity",
        "fidelity_policies", "fidelity_max_traces", "init_scorer"}  # init_scorer: by content, see SLData

    out_dir: str = "runs/sl"
    labels: Any = ""
    budget: int = 128
    interval: int = 32
    feature_set: list = field(default_factory=lambda: ["key", "value", "attn"])
    hidden: int = 16
    decay: float = 0.9
    margin: float = 0.01
    max_pairs: int = 0
    pair_weight: str = "uniform"
    feature_cache: str | None = None
    feature_cache_groups: str = "scorer"
    feature_dtype: str = "float16"
    replay_batch_size: int = 1
    eval_max_rows: int = 4000
    eval_fidelity: bool = True
    fidelity_policies: list = field(default_factory=lambda: ["streaming_llm", "random", "h2o", "golden"])
    fidelity_max_traces: int = 0
    dagger_rounds: int = 0
    dagger_beta: float = 0.5
    dagger_temperature: float = 0.0
    init_scorer: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if not self.traces or not self.labels:
            raise ValueError("set `traces` (a `foresight trace` directory) and `labels` (a `foresight golden` "
                             "directory)")
        labels = self.labels if isinstance(self.labels, list) else [self.labels]
        if not labels or not all(isinstance(x, str) and x for x in labels):  # e.g. labels=5: a TypeError later
            raise ValueError(f"labels must be a `foresight golden` directory or a list of them, got {self.labels!r}")
        if not 0 < self.interval < self.budget:
            raise ValueError(f"need 0 < interval < budget, got {self.interval}, {self.budget}")
        if not 0.0 <= self.decay <= 1.0:  # checked by the feature extractor only after the model load
            raise ValueError(f"decay must be in [0, 1], got {self.decay}")
        self.feature_set = list(check_feature_set(self.feature_set))
        if self.pair_weight not in PAIR_WEIGHTS:
            raise ValueError(f"pair_weight must be one of {', '.join(PAIR_WEIGHTS)}, got {self.pair_weight!r}")
        if self.hidden < 1 or self.margin < 0 or self.max_pairs < 0 or self.replay_batch_size < 1:
            raise ValueError("hidden and replay_batch_size must be >= 1, margin and max_pairs >= 0")
        if self.feature_cache_groups not in FEATURE_CACHE_GROUPS:
            raise ValueError(f"feature_cache_groups must be one of {', '.join(FEATURE_CACHE_GROUPS)}, got "
                             f"{self.feature_cache_groups!r}")
        if self.feature_dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"feature_dtype must be float16, bfloat16 or float32, got {self.feature_dtype}")
        for key in ("fidelity_max_traces", "eval_max_rows"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0 (0 = all), got {getattr(self, key)}")
        check_policy_names(self.fidelity_policies, "fidelity_policies")  # a typo fails now, not after training
        if self.dagger_rounds < 0:
            raise ValueError(f"dagger_rounds must be >= 0 (0 = no on-policy rounds), got {self.dagger_rounds}")
        if not 0.0 <= self.dagger_beta <= 1.0:
            raise ValueError(f"dagger_beta must be in [0, 1], got {self.dagger_beta}")
        if not (math.isfinite(self.dagger_temperature) and self.dagger_temperature >= 0.0):
            raise ValueError(f"dagger_temperature must be >= 0 (0 = the scorer's top-k), got {self.dagger_temperature}")
        if self.init_scorer is not None:
            self._check_init_scorer()

    def _check_init_scorer(self) -> None:
        """``init_scorer`` must be a scorer of this network: its feature set, hidden width and decay are the ones
        configured (a fine-tuned scorer keeps its architecture; set them to its values)."""
        if not isinstance(self.init_scorer, str) or not self.init_scorer:
            raise ValueError(f"init_scorer must be a scorer directory or a shipped scorer's name, got "
                             f"{self.init_scorer!r}")
        cfg = Scorer.from_pretrained(self.init_scorer).config
        want = {"feature_set": list(cfg.feature_set), "hidden": cfg.hidden, "decay": cfg.decay}
        for key, value in want.items():
            if getattr(self, key) != value:
                raise ValueError(f"{key}={getattr(self, key)!r} but init_scorer {self.init_scorer} has "
                                 f"{key}={value!r}; set {key}: {value!r} (fine-tuning keeps its network)")

    def to_dict(self) -> dict:
        d = super().to_dict()
        for key in ("dagger_temperature", "init_scorer"):  # recorded only when set: earlier runs read as they were
            if not d[key]:
                d.pop(key)
        return d
