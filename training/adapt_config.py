"""The keys of ``foresight train adapt`` (``configs/adapt.yaml``), validated on construction (docs/training.md, adaptation)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from foresight.adapters import AdapterError, adapter_identity
from foresight.config import ConfigError, check_adapter
from foresight.policies import make_policy
from foresight.policies.registry import check_policy_names
from foresight.schedule import CacheConfig
from foresight.scorer import CONFIG_NAME, WEIGHTS_NAME, resolve_scorer
from training.trainer_config import TracesConfig

#: LoRA on every attention projection of the Llama/Qwen families (the default targets).
ATTENTION_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj"]
#: Policies an adapter cannot be trained under: ``full`` never evicts (nothing to adapt to); ``golden`` replays
#: oracle labels of fixed traces and cannot run at decode time, where the adapter will be used.
NOT_ADAPTABLE = {"full": "never evicts, so there is nothing to adapt to",
                 "golden": "needs labels of fixed traces and cannot run at decode time"}


@dataclass
class AdaptConfig(TracesConfig):
    """Keys of ``configs/adapt.yaml`` (documented there); validated on construction."""

    RUN_CONTROL: ClassVar[frozenset] = TracesConfig.RUN_CONTROL | {  # paths: by content, see AdaptTask
        "heldout_traces", "scorer", "eval_policies", "eval_traces", "eval_before", "init_adapter"}

    out_dir: str = "runs/adapt"
    steps: int = 200
    lr: float = 1e-4
    warmup_steps: int = 10
    micro_batch: int = 1
    checkpoint_every: int = 50
    log_every: int = 10
    heldout_traces: str | None = None
    policy: str = "learned"
    policy_kwargs: dict = field(default_factory=dict)
    scorer: str | None = None
    budget: int = 64
    interval: int = 16
    sinks: int = 0
    init_adapter: str | None = None
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    target_modules: list = field(default_factory=lambda: list(ATTENTION_PROJECTIONS))
    ce_weight: float = 0.0
    anchor_weight: float = 0.0
    truncate_backprop: bool = False
    eval_policies: list = field(default_factory=list)
    eval_traces: int = 0
    eval_before: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.adapter is not None:
            raise ConfigError("adapter: `train adapt` trains an adapter on the base model; to continue training an "
                              "adapter, set `init_adapter` to it (to adapt a LoRA-tuned model, merge its adapter "
                              "into a model directory and set `model` to it)")
        if not self.traces:
            raise ConfigError("set `traces` (a `foresight trace` directory made by the base model)")
        if self.heldout_traces is not None and not Path(self.heldout_traces).is_dir():
            raise ConfigError(f"heldout_traces: {self.heldout_traces} is not a directory (a `foresight trace` output)")
        if not 0 < self.interval < self.budget:
            raise ConfigError(f"need 0 < interval < budget, got interval={self.interval}, budget={self.budget}")
        if self.sinks < 0 or self.eval_traces < 0:
            raise ConfigError("sinks and eval_traces must be >= 0")
        try:  # sinks past B - W: refused by the runtime after the model load, with split.json written
            CacheConfig(self.budget, self.interval, self.sinks)
        except ValueError as exc:
            raise ConfigError(f"budget/interval/sinks: {exc}") from None
        if self.lora_r < 1 or not self.lora_alpha > 0 or not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"need lora_r >= 1, lora_alpha > 0 and 0 <= lora_dropout < 1, got {self.lora_r}, "
                              f"{self.lora_alpha}, {self.lora_dropout}")
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise ConfigError(f"target_modules must be a non-empty list of module names, got {self.target_modules!r}")
        self._check_init_adapter()
        if self.ce_weight < 0:
            raise ConfigError(f"ce_weight must be >= 0, got {self.ce_weight}")
        if not self.anchor_weight >= 0:
            raise ConfigError(f"anchor_weight must be >= 0, got {self.anchor_weight}")
        for name in check_policy_names([self.policy], "policy") + check_policy_names(self.eval_policies,
                                                                                       "eval_policies"):
            if name in NOT_ADAPTABLE and name == self.policy:
                raise ConfigError(f"policy: {name!r} {NOT_ADAPTABLE[name]}; pick an evicting decode-time policy "
                                  "(learned, h2o, lazy, ...)")
            if name == "golden":
                raise ConfigError(f"eval_policies: 'golden' {NOT_ADAPTABLE['golden']}")
        if "learned" in (self.policy, *self.eval_policies):
            self._check_scorer()
        self.build_policy()  # unknown or bad hyperparameters fail now, before any model is loaded
        for name in dict.fromkeys(self.eval_policies):  # as the evaluation builds them: a learned scorer of another
            if name != self.policy:                      # B/W was refused after the whole training
                extra = {"scorer": self.scorer} if name == "learned" else {}
                try:
                    make_policy(name, **extra).check_cache(self.budget, self.interval)
                except ValueError as exc:
                    raise ConfigError(f"eval_policies: {name}: {exc}") from None

    def _check_init_adapter(self) -> None:
        """``init_adapter`` is a peft LoRA directory of the shape the LoRA keys describe (its base model is checked
        when the model is loaded, :meth:`training.adapt.AdaptTask`)."""
        if self.init_adapter is None:
            return
        try:
            check_adapter(self.init_adapter, "init_adapter")
            got = adapter_identity(self.init_adapter)  # the shape as the model fingerprint records it
        except AdapterError as exc:
            raise ConfigError(f"init_adapter: {exc}") from None
        have = {"peft_type": got["peft_type"], "lora_r": got["r"], "lora_alpha": got["lora_alpha"],
                "target_modules": got["target_modules"]}
        want = {"peft_type": "LORA", "lora_r": self.lora_r, "lora_alpha": self.lora_alpha,
                "target_modules": sorted(self.target_modules)}
        diff = [f"{k}={have[k]!r} (config: {want[k]!r})" for k in want if have[k] != want[k]]
        if diff:
            raise ConfigError(f"init_adapter {self.init_adapter}: has {', '.join(diff)}; set lora_r, lora_alpha and "
                              "target_modules to the adapter's")

    def _check_scorer(self) -> None:
        if not self.scorer:
            raise ConfigError("scorer: the learned policy needs `scorer` (a scorer directory, e.g. runs/sl/scorer); "
                              "it stays frozen while the adapter trains")
        missing = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if not (self.scorer_dir / n).is_file()]
        if missing:
            raise ConfigError(f"scorer {self.scorer}: no {', '.join(missing)} (pass a scorer directory or the name "
                              "of a shipped scorer)")

    @property
    def scorer_dir(self) -> Path:
        """The scorer directory (``scorer`` is a path or a shipped scorer's short name)."""
        return resolve_scorer(self.scorer)

    def build_policy(self, scorer=None):
        """The training policy (``learned`` with ``scorer``, a loaded :class:`~foresight.scorer.Scorer`, or the
        ``scorer`` directory)."""
        if "scorer" in self.policy_kwargs:
            raise ConfigError("policy_kwargs: give the scorer as the `scorer` key, not inside policy_kwargs")
        kwargs = dict(self.policy_kwargs)
        if self.policy == "learned":
            kwargs["scorer"] = scorer if scorer is not None else self.scorer
        try:
            policy = make_policy(self.policy, **kwargs)
        except ValueError as exc:
            raise ConfigError(f"policy_kwargs: {exc}") from None
        try:
            policy.check_cache(self.budget, self.interval)  # e.g. a scorer trained at another (B, W)
        except ValueError as exc:
            raise ConfigError(f"budget/interval: {exc}") from None
        return policy


__all__ = ["ATTENTION_PROJECTIONS", "AdaptConfig", "NOT_ADAPTABLE"]
