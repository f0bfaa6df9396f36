"""The training loop shared by every trainer (SL distillation, GRPO, adapt).

A trainer supplies a :class:`TaskData` (its split, loaded before the model) and a :class:`Task` on it (how to
compute this rank's loss for a step, and how to evaluate); the loop owns everything else, once:

* the DeepSpeed engine (:mod:`training.distributed`) around a ``torch.optim.Adam`` with a linear-warmup +
  cosine LR schedule, gradient clipping by DeepSpeed;
* non-finite losses or gradients: the step is skipped on every rank (no backward / no optimizer step, the LR
  schedule does not advance) and counted in ``skipped``; weights never become NaN;
* deterministic data order: :class:`StepSampler` derives each step's batch from (seed, step) alone, so a resumed
  run sees exactly the batches of an uninterrupted one;
* checkpoints every ``checkpoint_every`` steps and ``resume`` (:mod:`training.checkpoint`: safetensors + JSON,
  atomic, never unpickled); a resume refuses when a setting that defines the training differs
  (:func:`resume_settings`, checked by :func:`check_out_dir` before the model loads) and cuts ``metrics.jsonl``
  back to the checkpoint's step; a fresh run refuses an ``out_dir`` that holds checkpoints;
* metrics to a local JSONL and optionally wandb (:mod:`training.logging`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
from tqdm.auto import tqdm

from foresight import load_model
from foresight.atomic import atomic_write_text
from foresight.limits import check_memory
from training import checkpoint as ckpt
from training.distributed import (DistInfo, all_reduce, barrier, build_engine, init_distributed, load_ds_config,
                                  out_dir_lock)
from training.logging import MetricsLogger
from training.out_dir import check_claim, make_out_dir
from training.settings_check import check_settings
from training.trainer_config import TrainerConfig, lr_lambda, resume_settings


class StepSampler:
    """Batches of item indices as a pure function of (seed, step): a seeded permutation per epoch.

    A step consumes ``per_rank * world_size`` consecutive items of the epoch's permutation (the last partial
    batch of an epoch is dropped); rank ``r`` takes the strided share ``[r::world_size]``. With fewer items than
    a global batch, items repeat within the batch so every rank gets ``per_rank`` items.
    """

    def __init__(self, num_items: int, per_rank: int, world_size: int, seed: int):
        if num_items < 1:
            raise ValueError("no training items")
        self.n, self.per_rank, self.world, self.seed = num_items, per_rank, world_size, seed
        self.global_batch = per_rank * world_size
        self.steps_per_epoch = max(1, num_items // self.global_batch)

    def permutation(self, epoch: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.n, generator=gen)
        if self.n < self.global_batch:
            perm = perm.repeat(math.ceil(self.global_batch / self.n))
        return perm

    def batch(self, step: int, rank: int) -> list[int]:
        epoch, k = divmod(step, self.steps_per_epoch)
        perm = self.permutation(epoch)
        glob = perm[k * self.global_batch : (k + 1) * self.global_batch]
        return glob[rank :: self.world].tolist()


class Task(Protocol):
    """What a trainer plugs into :func:`train`."""

    module: torch.nn.Module

    def num_items(self) -> int:
        """Training items the sampler draws from."""

    def loss(self, model, items: list[int], step: int) -> tuple[torch.Tensor, dict]:
        """This rank's loss on ``items`` (call ``model`` = the engine for the forward) plus metrics."""

    def evaluate(self, step: int, final: bool) -> dict:
        """Validation metrics (called on every rank; return {} where a rank has nothing to report)."""

    # Optional: ``artefact`` (the name of what the run leaves in out_dir, default "scorer") and
    # ``save_artefact(path)`` (default: ``module.save_pretrained(path)``), see :func:`save_artefact`.


class TaskData(Protocol):
    """What a trainer loads before its model (:func:`run_task`), so that a ``--resume`` whose data differs is refused
    before the model loads: the split and the content digests of the data."""

    train_rows: list[dict]
    val_rows: list[dict]

    def resume_identity(self) -> dict:
        """Content digests of the split's traces and of the files the training starts from."""


def _grads_finite(module: torch.nn.Module) -> bool:
    for p in module.parameters():
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return False
    return True


def train(task: Task, cfg: TrainerConfig, dist: DistInfo, resume: bool = False,
          logger: MetricsLogger | None = None) -> dict[str, Any]:
    """Run ``cfg.steps`` optimisation steps of ``task`` through DeepSpeed; returns a summary dict."""
    out_dir = Path(cfg.out_dir)
    module = task.module
    optimizer = torch.optim.Adam(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio))
    ds_config = load_ds_config(cfg.deepspeed, micro_batch=cfg.micro_batch, grad_clip=cfg.grad_clip,
                               world_size=dist.world_size)
    engine = build_engine(module, optimizer, scheduler, ds_config)
    logger = logger or MetricsLogger(out_dir, enabled=dist.is_main)
    sampler = StepSampler(task.num_items(), cfg.micro_batch, dist.world_size, cfg.seed)

    settings = (resume_settings(cfg, dist.world_size, ds_config, task, run_device(cfg, dist))
                if resume or cfg.checkpoint_every else {})
    start, skipped = 0, 0
    if resume:
        manifest = ckpt.load(engine, out_dir, settings)
        start, skipped = int(manifest["step"]), int(manifest.get("skipped", 0))
        dropped = logger.truncate(start, redo_eval_at=cfg.steps)
        if dist.is_main:
            note = f"; dropped {dropped} metrics.jsonl records logged after it" if dropped else ""
            print(f"[foresight] resumed from step {start} ({out_dir / ckpt.CHECKPOINTS}){note}")
    last_metrics: dict = {}
    window: list[float] = []
    window_from = start + 1  # the first step the next logged loss averages
    t0 = time.time()
    stop = cfg.steps if not cfg.max_steps_per_run else min(cfg.steps, start + cfg.max_steps_per_run)
    bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step", disable=not dist.is_main,
               dynamic_ncols=True)
    for step in range(start, stop):
        engine.train()
        loss, metrics = task.loss(engine, sampler.batch(step, dist.rank), step)
        ok = torch.tensor([1.0 if bool(torch.isfinite(loss.detach()).all()) else 0.0])
        all_reduce(ok, "min")
        if ok.item() > 0:
            engine.backward(loss)
            gok = torch.tensor([1.0 if _grads_finite(module) else 0.0])
            all_reduce(gok, "min")
            if gok.item() > 0:
                engine.step()
            else:
                ok.zero_()
                engine.zero_grad()
        if ok.item() == 0:
            skipped += 1
        loss_val = torch.tensor([loss.detach().float().item() if ok.item() > 0 else 0.0])
        all_reduce(loss_val, "sum")
        if ok.item() > 0:
            window.append(loss_val.item() / dist.world_size)
        done = step + 1
        bar.update(1)
        if window:
            bar.set_postfix(loss=f"{window[-1]:.4f}", refresh=False)
        if cfg.log_every and (done % cfg.log_every == 0 or done == cfg.steps):
            last_metrics = {
                "loss": sum(window) / len(window) if window else float("nan"),
                "lr": scheduler.get_last_lr()[0],
                "skipped": skipped,
                "seconds": round(time.time() - t0, 2),
                **{k: v for k, v in metrics.items()},
            }
            if (window_from - 1) % cfg.log_every:  # a resume between two records: fewer steps than an uninterrupted
                last_metrics["window_from"] = window_from  # run's record averages, so the record says which
            window, window_from = [], done + 1
            logger.log(done, last_metrics, "train")
            if dist.is_main:
                bar.write(f"[foresight] step {done}/{cfg.steps} loss {last_metrics['loss']:.4f} "
                          f"lr {last_metrics['lr']:.2e} skipped {skipped}")
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0:
            ckpt.save(engine, out_dir, done, {"skipped": skipped}, settings, dist.is_main, cfg.keep_checkpoints)
        if cfg.eval_every and done % cfg.eval_every == 0 and done != cfg.steps:
            engine.eval()
            ev = task.evaluate(done, final=False)
            if ev:
                logger.log(done, ev, "eval")
            barrier()
    bar.close()
    if stop < cfg.steps:  # time-sliced run: the next `--resume` continues from the last checkpoint
        logger.close()
        return {"steps": stop, "skipped": skipped, "start": start, "train": last_metrics, "eval": {},
                "finished": False}
    if dist.is_main:  # the trained scorer is written before the final evaluation, which may be long or fail
        save_artefact(task, out_dir)
    engine.eval()
    final = task.evaluate(cfg.steps, final=True)
    if final:
        logger.log(cfg.steps, final, "eval")
    barrier()
    logger.close()
    return {"steps": cfg.steps, "skipped": skipped, "start": start, "train": last_metrics, "eval": final,
            "finished": True}


def artefact_name(task) -> str:
    """What a task's run leaves in ``out_dir``: ``scorer`` (SL, GRPO) or the task's ``artefact`` (``adapter``)."""
    return getattr(task, "artefact", "scorer")


def save_artefact(task, out_dir: Path) -> Path:
    """Write the trained artefact to ``out_dir/<artefact_name>``: ``task.save_artefact(path)`` when the task has
    one, else the module's ``save_pretrained`` (the scorer)."""
    path = Path(out_dir) / artefact_name(task)
    save = getattr(task, "save_artefact", None)
    (save if save is not None else task.module.save_pretrained)(path)
    return path


def task_model(cfg: TrainerConfig, dist: DistInfo, model=None):
    """The frozen LLM a task works on: ``model`` when given (in-process callers), else ``cfg.model`` (with
    ``cfg.adapter`` merged on top) loaded on this rank's device."""
    if model is not None:
        return model
    model, _ = load_model(cfg.model, device=run_device(cfg, dist), dtype=cfg.dtype, adapter=cfg.adapter)
    return model


def check_step_memory(cfg: TrainerConfig, dist: DistInfo, item_bytes: int, per: str = "", fix: str = "") -> None:
    """Refuse, before any work, a ``micro_batch`` whose step needs more memory than this rank's device has free:
    ``item_bytes`` is the task's estimate of one item's large tensors (``per``: what multiplies it besides
    ``micro_batch``, e.g. `` x group_size=8``; ``fix``: what else to lower), :func:`foresight.limits.check_memory`."""
    check_memory(cfg.micro_batch * item_bytes, run_device(cfg, dist), f"micro_batch={cfg.micro_batch}{per}",
                 f"lower micro_batch{fix}")


def run_device(cfg: TrainerConfig, dist: DistInfo):
    """The device this rank's model and task run on: ``cfg.device`` when set, else the rank's own."""
    return dist.device if cfg.device is None else cfg.device


def evaluate_before(cfg: TrainerConfig, resume: bool, name: str = "") -> Callable[[Task, MetricsLogger], dict]:
    """A ``before_train`` hook for :func:`run_task`: with ``cfg.eval_before`` on a fresh run (not a resume that
    finds a checkpoint), evaluate the initial model at step 0, log it and (with ``name``) print it."""
    def hook(task: Task, logger: MetricsLogger) -> dict:
        fresh = not (resume and ckpt.latest_step(Path(cfg.out_dir)) is not None)
        if not (getattr(cfg, "eval_before", False) and fresh):
            return {}
        before = task.evaluate(0, final=False)
        if before:
            logger.log(0, before, "eval")
            if name:
                print(f"[foresight] before {name}: {json.dumps(before)}", flush=True)
        return before

    return hook


def check_out_dir(cfg: TrainerConfig, dist: DistInfo, resume: bool, data: TaskData | None = None,
                  overwrite: bool = False) -> None:
    """Refuse (``ForesightError``) a run that ``out_dir`` does not fit, before anything is loaded or written: another
    kind's output or entries no training writes (:func:`foresight.outputs.check_output`), a fresh run where an
    earlier run is (:func:`refuse_fresh`; ``overwrite`` replaces it, see :func:`make_out_dir`), a resume without a
    checkpoint, with other settings or with damaged files. Without ``data`` the settings of the config alone are
    compared (before the data loads); with it every setting, the data's content digests included."""
    check_claim(cfg, resume, overwrite)
    if not resume:
        return
    path, manifest = ckpt.find_latest(cfg.out_dir)
    ds_config = load_ds_config(cfg.deepspeed, micro_batch=cfg.micro_batch, grad_clip=cfg.grad_clip,
                               world_size=dist.world_size)
    now = resume_settings(cfg, dist.world_size, ds_config, data, run_device(cfg, dist))
    check_settings(manifest["settings"], now, path, complete=data is not None)
    if data is None:
        ckpt.verify_files(path, manifest)


def run_task(cfg: TrainerConfig, load_data: Callable[[TrainerConfig], TaskData],
             make_task: Callable[[DistInfo, TaskData], Task], resume: bool = False,
             describe: Callable[[Task], str] | None = None,
             before_train: Callable[[Task, MetricsLogger], dict] | None = None,
             overwrite: bool = False) -> dict[str, Any]:
    """The shared life cycle of a trainer run (SL, GRPO, adapt): check ``out_dir`` against the run
    (:func:`check_out_dir`: the config first, the data once loaded, both before the model loads), set up ranks and
    logging, write ``split.json``, :func:`train` (which saves the final scorer before the final evaluation) and
    ``summary.json`` on rank 0.

    ``load_data(cfg)`` loads the split without the model; ``make_task(dist, data)`` builds the task on it (with
    ``train_rows``/``val_rows``); ``describe(task)`` is printed once; ``before_train(task, logger)`` may evaluate the
    initial model (rank 0) and returns what goes into the summary as ``eval_before``. ``overwrite`` replaces an
    earlier run in ``out_dir`` (of the same trainer) once the data has loaded. The whole run holds ``out_dir``'s lock
    (:func:`training.distributed.out_dir_lock`): a second run on it is refused at once.
    """
    dist = init_distributed(cfg.device)
    with out_dir_lock(cfg.out_dir, dist):
        return _run_task(cfg, dist, load_data, make_task, resume, describe, before_train, overwrite)


def _run_task(cfg: TrainerConfig, dist: DistInfo, load_data, make_task, resume: bool, describe,
              before_train, overwrite: bool) -> dict[str, Any]:
    """:func:`run_task` under the lock."""
    check_out_dir(cfg, dist, resume, overwrite=overwrite)  # fail fast, before the (possibly long) data preparation
    data = load_data(cfg)
    if resume:  # the data's digests too: a refused resume loads no model and writes nothing
        check_out_dir(cfg, dist, resume, data)
    torch.manual_seed(cfg.seed)
    task = make_task(dist, data)
    make_out_dir(cfg, dist, overwrite)  # the task's checks passed: a refused run replaces nothing
    out = Path(cfg.out_dir)
    logger = MetricsLogger(out, enabled=dist.is_main, report_to=cfg.report_to, project=cfg.wandb_project,
                           run_name=cfg.run_name, run_config=cfg.to_dict())
    if not resume:  # a fresh run logs afresh: no record of an earlier run in this out_dir (a resume cuts them back)
        logger.truncate(-1)
    before: dict = {}
    if dist.is_main:
        if not resume:  # an earlier run's summary would describe this run's artefact (export quotes it) until the end
            (out / "summary.json").unlink(missing_ok=True)
        atomic_write_text(out / "split.json", json.dumps({"train": [r["trace_id"] for r in task.train_rows],
                                                          "heldout": [r["trace_id"] for r in task.val_rows]}, indent=1))
        if describe is not None:
            print(f"[foresight] {describe(task)}", flush=True)
        if before_train is not None:
            before = before_train(task, logger) or {}
    barrier()
    summary = train(task, cfg, dist, resume=resume, logger=logger)
    if dist.is_main:
        if before:
            summary["eval_before"] = before
        if summary.get("finished"):  # train() wrote it before the final evaluation
            summary[artefact_name(task)] = str(out / artefact_name(task))
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary
