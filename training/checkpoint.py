"""Checkpoints and resumption shared by the trainers: safetensors + JSON only, written atomically.

**Nothing is ever unpickled.** DeepSpeed's own ``save_checkpoint``/``load_checkpoint`` store ``torch.save``
pickles and read them back with ``torch.load`` and weights-only mode off, so a replaced checkpoint file could
run code on ``--resume``. We write and read the state ourselves:

``<out_dir>/checkpoints/step_000100/``
    ``model.safetensors``      the scorer's ``state_dict`` (rank 0)
    ``optimizer.safetensors``  ZeRO stage 0: the torch optimizer's state tensors; its non-tensor structure
                               (param groups, hyperparameters) as JSON in the safetensors header (rank 0)
    ``rank-00001.safetensors`` per rank: torch/CUDA RNG states as uint8 tensors, numpy's MT19937 key, the
                               Python ``random`` state as JSON, and with ZeRO stage 1/2 this rank's optimizer
                               partition (the base optimizer's state over its flat fp32 partition + the fp32
                               master partition itself)
    ``scorer/``                a ready-to-use scorer directory (:meth:`foresight.scorer.Scorer.save_pretrained`)
    ``checkpoint.json``        the manifest, written last: step, skipped steps, LR-scheduler state, DeepSpeed
                               step counters, the *settings* that define the training, and size + sha256 of
                               every file above
``<out_dir>/checkpoints/latest``   the newest tag (informational; resume scans for the newest manifest)

**ZeRO.** Stage 0 replicates the optimizer, so rank 0 writes it once and every rank reads that file. Stages
1 and 2 partition it: every rank saves and restores its own partition, which is exact for the same world
size and stage; both are among the recorded settings, so resuming with another world size or stage is
refused. Stage 3 is refused. All ranks must see the same ``out_dir`` (a shared file system across nodes).

**Atomic writes.** Every rank writes into ``checkpoints/.tmp-step_000100``; after a barrier rank 0 hashes the
files, writes the manifest, fsyncs and renames the directory to ``step_000100`` (then updates ``latest`` via
rename, and moves pruned checkpoints aside before deleting them). A checkpoint directory with a manifest is
therefore complete; a kill at any point leaves the previous checkpoint intact and resumable, and leftover
``.tmp-*``/``.trash-*`` directories are ignored and cleaned up by the next save.

**Resume** (:func:`load`) picks the newest ``step_*`` with a manifest, refuses (``ForesightError``, naming the
keys) when the settings differ from this run's, verifies every file's size and sha256, then restores weights,
optimizer, scheduler, counters and RNG. Data order is a pure function of (seed, step) (see
:class:`training.loop.StepSampler`), so a resumed run equals an uninterrupted one.

The file encoding is :mod:`training.state_io`, the settings comparison :mod:`training.settings_check`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from foresight.atomic import atomic_write_text, fsync_path, writing
from foresight.errors import ForesightError
from foresight.fingerprint import file_sha256
from training.distributed import barrier
from training.settings_check import check_settings, plain
from training.state_io import flatten_state, load_tensors, rng_state, save_tensors, set_rng_state, unflatten_state

CHECKPOINTS = "checkpoints"
MANIFEST = "checkpoint.json"
FORMAT = "foresight-checkpoint/1"


def tag_for(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINTS


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


# ----------------------------------------------------------------------------------------------------------------
# Finding checkpoints
# ----------------------------------------------------------------------------------------------------------------


def _complete(root: Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of every ``step_<digits>`` directory with a manifest, oldest first."""
    out = []
    for p in root.glob("step_*") if root.is_dir() else []:
        digits = p.name.removeprefix("step_")
        if digits.isascii() and digits.isdigit() and (p / MANIFEST).is_file():
            out.append((int(digits), p))
    return sorted(out)


def latest_step(out_dir: str | Path) -> int | None:
    """Step of the newest complete checkpoint under ``out_dir`` (None when there is none)."""
    found = _complete(checkpoint_root(out_dir))
    return found[-1][0] if found else None


def refuse_fresh(out_dir: str | Path) -> None:
    """A run without ``--resume`` refuses an ``out_dir`` that holds checkpoints (``ForesightError``): kept, an
    earlier run's checkpoints may have higher steps than this run's, and a later ``--resume`` would silently go on
    from the earlier run."""
    step = latest_step(out_dir)
    if step is not None:
        root = checkpoint_root(out_dir)
        raise ForesightError(f"out_dir {out_dir} holds the checkpoints of an earlier run (newest: "
                             f"{root / tag_for(step)}); pass --resume to continue it, --overwrite to replace it, or "
                             "choose another out_dir")


def find_latest(out_dir: str | Path, who: str = "--resume") -> tuple[Path, dict]:
    """The newest complete checkpoint directory and its manifest; ``ForesightError`` when there is none, its
    message starting with ``who`` (the flag or tool that asked for the checkpoint)."""
    root = checkpoint_root(out_dir)
    found = _complete(root)
    if not found:
        if any((p / "mp_rank_00_model_states.pt").exists() for p in root.glob("step_*")):
            raise ForesightError(f"{who}: the checkpoints under {root} are in DeepSpeed's pickle format, which "
                                 "is never loaded (unpickling can run code); start again in a fresh out_dir")
        raise ForesightError(f"{who}: no checkpoint under {root}")
    step, path = found[-1]
    return path, _read_json(path / MANIFEST, who, step)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_json(path: Path, who: str, step: int) -> dict:
    """The manifest at ``path`` of the checkpoint of ``step`` (its directory's name): its own ``step`` must be that
    one, and its counters whole numbers no larger (an edited ``"step": -5`` or ``1e30`` is never resumed from)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForesightError(f"{who}: {path} is not a readable checkpoint manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("settings"), dict):
        raise ForesightError(f"{who}: {path} is not a {FORMAT} manifest")
    if data.get("step") != step or not _count(data.get("step")):
        raise ForesightError(f"{who}: {path} records step {data.get('step')!r}, but it is the checkpoint of step "
                             f"{step} ({path.parent.name}); it was edited or damaged: delete {path.parent} to resume "
                             "from the previous checkpoint")
    engine = data.get("engine", {})
    bad = ([f"{data.get('skipped')!r} skipped steps"] if not _count(data.get("skipped", 0))
           or data.get("skipped", 0) > step else [])
    bad += ["engine counters that are not whole numbers"] if not isinstance(engine, dict) or not all(
        _count(v) for v in engine.values()) else []
    if bad:
        raise ForesightError(f"{who}: {path} records {bad[0]} at step {step}; it was edited or damaged: delete "
                             f"{path.parent} to resume from the previous checkpoint")
    return data


def _zero_stage(engine) -> int:
    stage = int(engine.zero_optimization_stage()) if hasattr(engine, "zero_optimization_stage") else 0
    if stage not in (0, 1, 2):
        raise ForesightError(f"checkpoints support ZeRO stages 0, 1 and 2, the DeepSpeed config asks stage {stage}")
    return stage


def _engine_counters(engine) -> dict:
    return {k: int(getattr(engine, k)) for k in ("global_steps", "global_samples", "skipped_steps", "micro_steps")
            if isinstance(getattr(engine, k, None), int)}


# ----------------------------------------------------------------------------------------------------------------
# Save / load
# ----------------------------------------------------------------------------------------------------------------


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def save(engine, out_dir: str | Path, step: int, counters: dict, settings: dict, is_main: bool,
         keep_last: int = 0) -> Path:
    """Write checkpoint ``step`` atomically (collective: every rank must call it). An error (a full disk: one line
    naming the checkpoint, :func:`foresight.atomic.writing`) removes this rank's part of the unfinished checkpoint,
    rank 0 the whole ``.tmp-step_*`` directory."""
    tmp = checkpoint_root(out_dir) / f".tmp-{tag_for(step)}"
    try:
        with writing(tmp.with_name(tag_for(step))):
            return _save(engine, out_dir, step, counters, settings, is_main, keep_last)
    except BaseException:
        rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
        (tmp / _rank_file(rank)).unlink(missing_ok=True)
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _save(engine, out_dir: str | Path, step: int, counters: dict, settings: dict, is_main: bool,
          keep_last: int) -> Path:
    """:func:`save`'s writes."""
    stage = _zero_stage(engine)
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    root = checkpoint_root(out_dir)
    tag = tag_for(step)
    tmp = root / f".tmp-{tag}"
    if is_main:
        for stale in [*root.glob(".tmp-*"), *root.glob(".trash-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    tensors, meta = rng_state()
    if stage > 0:
        zero = engine.optimizer
        opt_tensors, meta["optimizer"] = flatten_state(zero.optimizer.state_dict(), "opt")
        tensors.update(opt_tensors)
        for i, part in enumerate(zero.single_partition_of_fp32_groups):
            tensors[f"fp32.{i}"] = part.detach().cpu().clone()
        meta["fp32_groups"] = len(zero.single_partition_of_fp32_groups)
    save_tensors(tmp / _rank_file(rank), tensors, meta)
    barrier()
    if is_main:
        module = engine.module
        state = {k: v.detach().cpu().clone().contiguous() for k, v in module.state_dict().items()}
        save_tensors(tmp / "model.safetensors", state, None)
        if stage == 0:
            save_tensors(tmp / "optimizer.safetensors", *flatten_state(engine.optimizer.state_dict(), "opt"))
        if hasattr(module, "save_pretrained"):
            module.save_pretrained(tmp / "scorer")
        files = {}
        for p in _files(tmp):
            fsync_path(p)
            files[p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        scheduler = None
        if engine.lr_scheduler is not None:
            sched_tensors, scheduler = flatten_state(engine.lr_scheduler.state_dict(), "sched")
            if sched_tensors:
                raise TypeError("LR-scheduler state with tensors is not supported")
        manifest = {"format": FORMAT, "step": int(step), **{k: int(v) for k, v in counters.items()},
                    "zero_stage": stage, "scheduler": scheduler,
                    "engine": _engine_counters(engine), "settings": plain(settings), "files": files}
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
        final = root / tag
        if final.exists():  # a checkpoint of the same step from an earlier, abandoned run
            final.rename(root / f".trash-{tag}")
        tmp.rename(final)
        fsync_path(root)
        atomic_write_text(root / "latest", tag)
        if keep_last > 0:
            old = [p for _, p in _complete(root) if p.name != tag]
            for p in old[: max(0, len(old) - (keep_last - 1))]:
                trash = root / f".trash-{p.name}"
                p.rename(trash)  # atomic: a half-deleted checkpoint never looks complete
                shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(root / f".trash-{tag}", ignore_errors=True)
    barrier()
    return root / tag


def verify_files(path: Path, manifest: dict) -> None:
    """Every file the manifest lists has its recorded size and sha256 (else ``ForesightError`` naming it)."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ForesightError(f"--resume: {path / MANIFEST} lists no files")
    for name, info in sorted(files.items()):
        f = path / name
        ok = isinstance(info, dict) and f.is_file() and f.stat().st_size == info.get("bytes")
        if not ok or file_sha256(f) != info.get("sha256"):
            raise ForesightError(f"--resume: checkpoint file {f} is missing or damaged (size/sha256 differ from "
                                 f"{path / MANIFEST}); delete {path} to resume from the previous checkpoint")


def load(engine, out_dir: str | Path, settings: dict) -> dict:
    """Restore the newest checkpoint into ``engine`` (weights, optimizer, scheduler, counters, this rank's RNG).

    Raises ``ForesightError`` when there is none, when its settings differ from ``settings`` or when a file
    is damaged. Returns the manifest (``step``, ``skipped``, ...).
    """
    path, manifest = find_latest(out_dir)
    check_settings(manifest["settings"], settings, path)
    stage = _zero_stage(engine)
    verify_files(path, manifest)
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    for need in ["model.safetensors", _rank_file(rank)] + (["optimizer.safetensors"] if stage == 0 else []):
        if need not in manifest["files"]:
            raise ForesightError(f"--resume: {path / MANIFEST} lists no {need}")
    weights, _ = load_tensors(path / "model.safetensors")
    try:
        engine.module.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        raise ForesightError(f"--resume: {path / 'model.safetensors'} does not fit this scorer ({exc})") from None
    rank_tensors, rank_meta = load_tensors(path / _rank_file(rank))
    try:
        if stage == 0:
            opt_tensors, opt_meta = load_tensors(path / "optimizer.safetensors")
            engine.optimizer.load_state_dict(unflatten_state(opt_meta, opt_tensors))
        else:
            zero = engine.optimizer
            zero.optimizer.load_state_dict(unflatten_state(rank_meta["optimizer"], rank_tensors))
            for i, part in enumerate(zero.single_partition_of_fp32_groups):
                part.data.copy_(rank_tensors[f"fp32.{i}"])
        if manifest.get("scheduler") is not None and engine.lr_scheduler is not None:
            engine.lr_scheduler.load_state_dict(unflatten_state(manifest["scheduler"], {}))
        set_rng_state(rank_tensors, rank_meta)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ForesightError(f"--resume: the checkpoint {path} does not fit this run ({type(exc).__name__}: "
                             f"{exc})") from None
    for k, v in manifest.get("engine", {}).items():
        setattr(engine, k, int(v))
    return manifest
