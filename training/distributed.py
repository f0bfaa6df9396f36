"""DeepSpeed set-up shared by every trainer (SL distillation, GRPO).

Works the same under the standard launchers and without one:

* ``deepspeed --num_gpus N -m foresight train ...`` / ``deepspeed --hostfile H ...`` (multi-node),
* ``torchrun --nproc_per_node N -m foresight train ...``,
* plain ``python -m foresight train ...`` (a single process: we fill in ``RANK=0``/``WORLD_SIZE=1`` and a free
  local port so DeepSpeed needs no MPI discovery).

On machines without CUDA (or with ``DS_ACCELERATOR=cpu``) DeepSpeed uses its CPU accelerator and we use the
``gloo`` process-group backend. DeepSpeed JIT-builds a small shared-memory communication op on first use (a
few minutes on CPU); ``TORCH_EXTENSIONS_DIR`` defaults to ``<foresight cache>/torch_extensions`` so that
happens once per machine. We hand DeepSpeed a plain ``torch.optim.Adam`` (``zero_allow_untested_optimizer``),
so no fused-Adam extension is compiled.

The ranks meet (torch's ``env://`` rendezvous) within ``FORESIGHT_RENDEZVOUS_TIMEOUT`` seconds (default
:data:`RENDEZVOUS_TIMEOUT`): ``RANK=0 WORLD_SIZE=2`` with no second rank is one line and exit status 2, not a wait
forever. Only the meeting is bounded; collectives keep torch's own timeout.
"""

from __future__ import annotations

import copy
import json
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from foresight.errors import ForesightError
from foresight.models import cache_dir
from foresight.run_lock import locked_out_dir


#: Seconds the ranks of a multi-process run have to meet (``FORESIGHT_RENDEZVOUS_TIMEOUT`` overrides it).
RENDEZVOUS_TIMEOUT = 600
RENDEZVOUS_ENV = "FORESIGHT_RENDEZVOUS_TIMEOUT"


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare_env(device: str | None) -> str:
    """Set the environment DeepSpeed reads; return the process-group backend to use."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir() / "torch_extensions"))
    want_cpu = (device or "").startswith("cpu") or not torch.cuda.is_available()
    if want_cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # no launcher: a single process
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("LOCAL_RANK", "0")
    return "gloo" if os.environ.get("DS_ACCELERATOR") == "cpu" else "nccl"


def init_distributed(device: str | None = None) -> DistInfo:
    """Initialise the process group through DeepSpeed (idempotent) and pick this rank's device."""
    backend = _prepare_env(device)
    import deepspeed  # optional (the `train` extra): only training needs it, and it is slow to import

    if not dist.is_initialized():
        if int(os.environ["WORLD_SIZE"]) > 1:
            _meet(backend)
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "nccl":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    return DistInfo(rank, world, local_rank, dev)


def rendezvous_timeout() -> float:
    """Seconds the ranks have to meet: ``$FORESIGHT_RENDEZVOUS_TIMEOUT`` (a positive number) or
    :data:`RENDEZVOUS_TIMEOUT`."""
    text = os.environ.get(RENDEZVOUS_ENV, str(RENDEZVOUS_TIMEOUT))
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ForesightError(f"{RENDEZVOUS_ENV}={text!r}: expected a number of seconds > 0")
    return seconds


def _meet(backend: str) -> None:
    """Start the default process group through torch's ``env://`` rendezvous, bounded by :func:`rendezvous_timeout`:
    a rank that no other joins (or that finds no rank 0) raises a :class:`ForesightError` naming ``RANK``,
    ``WORLD_SIZE`` and the address. The store then takes torch's default timeout, which collectives keep."""
    from torch.distributed.constants import default_pg_timeout

    seconds = rendezvous_timeout()
    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    try:
        store, r, w = next(dist.rendezvous("env://", timeout=timedelta(seconds=seconds)))
    except (RuntimeError, ValueError) as exc:  # DistStoreError / DistNetworkError are RuntimeErrors
        raise ForesightError(f"RANK={rank} WORLD_SIZE={world}: the {world} ranks did not all meet at {where} within "
                             f"{seconds:g} s ({RENDEZVOUS_ENV}; {type(exc).__name__}); start every rank (`foresight "
                             "launch`, torchrun), or unset RANK and WORLD_SIZE to run one process") from None
    store.set_timeout(default_pg_timeout)
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=r, world_size=w)


def shutdown_distributed() -> None:
    """End a multi-rank run cleanly: the ranks leave together and the process group is destroyed. A gloo group
    left to the interpreter's exit can abort a rank ("terminate called without an active exception", exit -6)
    after its work is done. Single-process runs (and in-process tests) keep their group."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        dist.destroy_process_group()


def load_ds_config(path: str | Path, *, micro_batch: int, grad_clip: float, world_size: int) -> dict:
    """Read a DeepSpeed JSON config and fill in the values our trainer config owns.

    ``train_micro_batch_size_per_gpu`` (items per rank per step), ``gradient_accumulation_steps`` (1),
    ``train_batch_size`` and ``gradient_clipping`` are set from the trainer config; everything else (ZeRO
    stage, communication settings) comes from the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ForesightError(f"DeepSpeed config not found: {path}")
    cfg = json.loads(path.read_text())
    cfg = copy.deepcopy(cfg)
    cfg["train_micro_batch_size_per_gpu"] = int(micro_batch)
    cfg["gradient_accumulation_steps"] = 1
    cfg["train_batch_size"] = int(micro_batch) * int(world_size)
    cfg["gradient_clipping"] = float(grad_clip)
    cfg.setdefault("zero_allow_untested_optimizer", True)
    cfg.setdefault("steps_per_print", 10**9)
    cfg.setdefault("wall_clock_breakdown", False)
    return cfg


def build_engine(module: torch.nn.Module, optimizer, scheduler, ds_config: dict):
    """``deepspeed.initialize`` with our optimizer and LR scheduler; returns the engine."""
    import deepspeed  # optional (the `train` extra), see init_distributed

    engine, _, _, _ = deepspeed.initialize(
        model=module, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
    )
    return engine


def all_reduce(value: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """All-reduce a tensor across ranks, in place (no-op without a process group). NCCL reduces CUDA tensors only,
    so under it a CPU tensor (the loop's step flags and loss) travels through a copy on this rank's GPU."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if dist.get_backend() == "nccl" and value.device.type != "cuda":
            on_gpu = value.to(_nccl_device(), copy=True)
            dist.all_reduce(on_gpu, op=ops[op])
            value.copy_(on_gpu)
        else:
            dist.all_reduce(value, op=ops[op])
    return value


def _nccl_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def all_agree(ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (collective: every rank calls it; without a process group, ``ok``)."""
    flag = torch.tensor([1.0 if ok else 0.0])
    return bool(all_reduce(flag, "min").item() > 0)


def out_dir_lock(out_dir: str | Path, dist: DistInfo):
    """``out_dir``'s lock (:func:`foresight.run_lock.locked_out_dir`) for a training run: rank 0 takes it and every
    rank learns its answer, so all ranks of a refused run refuse together (collective)."""
    return locked_out_dir(out_dir, what="training run", is_main=dist.is_main, agree=all_agree)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shard(items: list, rank: int, world_size: int) -> list:
    """This rank's share of ``items`` (strided, so shares differ in size by at most one)."""
    return items[rank::world_size]
