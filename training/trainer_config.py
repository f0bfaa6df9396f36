"""The keys every trainer shares (optimisation, checkpointing, logging) and what a resume must match.

:class:`TrainerConfig` is the base of each trainer's dataclass config, :class:`TracesConfig` that of the trainers
that read traces (``SLConfig``, ``AdaptConfig``, and ``GRPOConfig`` and ``E2EConfig`` through
:class:`training.refine_config.RefinementConfig`), validated on construction; :func:`resume_settings` is the record
a ``--resume`` compares (:mod:`training.settings_check`); :func:`lr_lambda` is the schedule the loop (:mod:`training.loop`) steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar

import torch

from foresight.adapters import ADAPTER_WEIGHTS
from foresight.config import ConfigError, check_adapter, check_device, check_fields, check_keys, read_json
from foresight.fingerprint import dtype_name
from foresight.models import resolved_dtype
from training.digests import digest, digest_files
from training.logging import REPORTERS


@dataclass
class TrainerConfig:
    """Optimisation, checkpointing and logging keys common to every trainer (see ``configs/sl.yaml``)."""

    #: Keys that do not define the training result, so ``--resume`` may change them (every other key must match
    #: the checkpoint's; path keys whose *content* matters are replaced by the task's ``resume_identity()``).
    RUN_CONTROL: ClassVar[frozenset] = frozenset({
        "out_dir", "checkpoint_every", "keep_checkpoints", "log_every", "eval_every", "deepspeed", "report_to",
        "wandb_project", "run_name", "device", "max_steps_per_run",
        "adapter"})  # by content: resume_settings records its weights' digest

    out_dir: str = "runs/train"
    steps: int = 200
    lr: float = 1e-2
    warmup_steps: int = 10
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch: int = 4
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every: int = 0
    deepspeed: str = "configs/deepspeed/zero0.json"
    report_to: str = "none"
    wandb_project: str = "foresightkv"
    run_name: str | None = None
    device: str | None = None
    max_steps_per_run: int = 0
    #: PEFT adapter directory loaded (merged) on top of the trainer's ``model`` (docs/training.md, adaptation); the model's
    #: fingerprint then records it, so traces, labels and scorers made without it are refused.
    adapter: str | None = None

    def __post_init__(self):
        check_fields(self)  # types first: every later check may compare numbers
        for name in ("steps", "micro_batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "keep_checkpoints", "log_every", "eval_every",
                     "max_steps_per_run"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.slice_stalls(self.max_steps_per_run):
            raise ValueError(f"max_steps_per_run={self.max_steps_per_run} stops before the next checkpoint "
                             f"(checkpoint_every={self.checkpoint_every}), so a --resume starts again from the last "
                             "one and never gets further; set checkpoint_every to at most max_steps_per_run")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("grad_clip and weight_decay must be >= 0")
        if self.report_to not in REPORTERS:
            raise ValueError(f"report_to must be one of {', '.join(REPORTERS)}, got {self.report_to!r}")
        check_device(self.device, "device")
        check_adapter(self.adapter, "adapter")
        # exists, parses and asks for what this trainer can run, before any work (DeepSpeed or the first checkpoint
        # found the rest after the data preparation, with split.json written)
        check_ds_content(read_json(self.deepspeed, "DeepSpeed config (config key `deepspeed`)", expect=dict),
                         self.deepspeed, self.device)

    def slice_stalls(self, slice_steps: int) -> bool:
        """Whether a time slice of ``slice_steps`` (``max_steps_per_run``, or what is left of it) ends before the run
        and before any checkpoint: its steps would be lost, and a ``--resume`` would start from the same place."""
        return 0 < slice_steps < self.steps and not 0 < self.checkpoint_every <= slice_steps

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def keys(cls) -> list[str]:
        """The config's keys (every init field), in declaration order."""
        return [f.name for f in fields(cls) if f.init]

    @classmethod
    def from_dict(cls, d: dict) -> "TrainerConfig":
        return cls(**check_keys(d, cls.keys(), "config"))


@dataclass
class TracesConfig(TrainerConfig):
    """A trainer that reads ``traces`` of ``model`` (its ``dtype``), the first ``max_traces`` of them, and holds
    problems out (``heldout``: a fraction or a count, drawn with ``split_seed``); validated on construction."""

    RUN_CONTROL: ClassVar[frozenset] = TrainerConfig.RUN_CONTROL | {"traces"}  # by content: each task's data digest

    model: str = "smollm2-135m"
    dtype: str | None = None
    traces: str | list[str] = ""
    max_traces: int = 0
    heldout: float = 0.25
    split_seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16, float16 or null, got {self.dtype!r}")
        check_heldout(self.heldout)
        if self.max_traces < 0:
            raise ConfigError(f"max_traces must be >= 0 (0 = all), got {self.max_traces}")


def check_heldout(heldout: float) -> None:
    """Refuse a ``heldout`` that is neither a fraction in (0, 1) nor a whole number of problems."""
    h = float(heldout)
    if not (0 < h < 1 or (h >= 1 and h == int(h))):
        raise ConfigError(f"heldout must be a fraction in (0, 1) or a number of problems, got {heldout}")


def lr_lambda(warmup: int, total: int, min_ratio: float = 0.0):
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        span = max(1, total - warmup)
        progress = min(1.0, (step - warmup) / span)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def check_ds_content(ds: dict, path, device: str | None) -> None:
    """Refuse a DeepSpeed config this trainer cannot use: a ``zero_optimization`` that is not an object, a ZeRO
    stage other than 0, 1, 2 (what checkpoints hold), or fp16 / bf16 mixed precision without a GPU."""
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ValueError(f"DeepSpeed config {path}: zero_optimization must be an object such as {{\"stage\": 1}}, "
                         f"got {zero!r}")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2) or isinstance(stage, bool):
        raise ValueError(f"DeepSpeed config {path}: ZeRO stage {stage!r}; checkpoints support stages 0, 1 and 2")
    on_gpu = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    for key in ("fp16", "bf16"):
        block = ds.get(key)
        if isinstance(block, dict) and block.get("enabled") and not on_gpu:
            raise ValueError(f"DeepSpeed config {path}: {key}.enabled needs a GPU (the scorer trains in float32 on "
                             "CPU); disable it")


def zero_stage(ds_config: dict) -> int:
    return int((ds_config.get("zero_optimization") or {}).get("stage", 0))


def resume_settings(cfg: TrainerConfig, world_size: int, ds_config: dict, task=None, device=None) -> dict:
    """What defines a training run and must match on ``--resume``: the config minus ``RUN_CONTROL`` keys, the
    world size, the DeepSpeed config (stage by itself, the rest as a digest), given ``device`` the dtype a trainer's
    model gets there (``dtype: null`` resolves per device: a bf16 GPU run resumed on a CPU would mix precisions) and,
    given ``task``, its ``resume_identity()`` (content digests of traces, labels, initial scorers)."""
    out = {k: v for k, v in cfg.to_dict().items() if k not in type(cfg).RUN_CONTROL}
    if device is not None and "dtype" in out:  # only when not float32, so CPU runs' settings are what they were
        name = dtype_name(resolved_dtype(cfg.model, cfg.dtype, device))
        if name is not None:
            out["weights_dtype"] = name
    out.update(world_size=int(world_size), zero_stage=zero_stage(ds_config),
               deepspeed=digest([json.dumps(ds_config, sort_keys=True)]))
    if cfg.adapter:  # only when set, so the settings of runs without one are what they always were
        out["adapter"] = digest_files([Path(cfg.adapter) / ADAPTER_WEIGHTS])
    if task is not None and hasattr(task, "resume_identity"):
        out.update(task.resume_identity())
    return out
