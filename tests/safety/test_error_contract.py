"""One error contract for the machine's limits (foresight/errors.py, foresight/atomic.py): a full disk and an exhausted
memory are one line naming the path or the size, exit status 2, the same in every job, with nothing half-written
left; and an error line is never swallowed (FORESIGHT_ERROR_DIR records it and prints it)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from foresight.cli import ERROR_DIR, main

TINY = ["--model", "tiny-llama"]
B, W = 16, 4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    from tests.conftest import trace_dir
    from tests.training.test_sl import _make_data

    root = tmp_path_factory.mktemp("limits")
    traces, labels = _make_data(root / "sl", n=4)
    return {"traces": trace_dir(root / "traces"), "sl_traces": traces, "sl_labels": labels, "root": root}


def _error_line(stderr: str) -> str:
    """The one error line in ``stderr`` (progress bars aside), which must have no traceback."""
    found = re.findall(r"foresight [a-z ]+: (?:internal )?error: .*", stderr)
    assert len(found) == 1 and "Traceback" not in stderr, stderr
    return found[0]


def _jobs(p: dict, out: Path) -> dict[str, list[str]]:
    from tests.training.test_sl import REPO

    return {
        "trace": ["trace", *TINY, "--data", "synthetic", "--limit", "2", "--max-new-tokens", "40", "--batch-size", "2",
                  "--out", str(out), "--no-progress"],
        "golden": ["golden", *TINY, "--traces", str(p["traces"]), "--out", str(out), "--budget", str(B), "--interval",
                   str(W), "--no-progress"],
        "train": ["train", "sl", "--config", str(REPO / "configs" / "sl.yaml"), "model=tiny-llama",
                  f"traces={p['sl_traces']}", f"labels={p['sl_labels']}", f"budget={B}", f"interval={W}", "heldout=1",
                  "steps=2", "micro_batch=2", "warmup_steps=0", "checkpoint_every=1", "log_every=1", "eval_every=0",
                  "eval_fidelity=false", f"out_dir={out}", f"feature_cache={p['root'] / 'features'}", "device=cpu",
                  f"deepspeed={REPO / 'configs' / 'deepspeed' / 'zero0.json'}"],
        "eval": ["eval", "fidelity", *TINY, "--traces", str(p["traces"]), "--policies", "full,random", "--budget",
                 str(B), "--interval", str(W), "--quiet", "--out", str(out)],
    }


@pytest.fixture
def small_disk(tmp_path):
    """A directory on a 1 MiB tmpfs where this process may mount one (root), else None (a simulated full disk)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                                       capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` up to ``leave`` free bytes."""
    st = os.statvfs(disk)
    with open(disk / ".filler", "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))


def _simulate_full_disk(monkeypatch, under: Path) -> None:
    """Every flush of a file under ``under`` fails as a full disk does (ENOSPC)."""
    import foresight.atomic
    import training.checkpoint

    real = foresight.atomic.fsync_path

    def full(path):
        if Path(path).resolve().is_relative_to(under.resolve()):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path)

    monkeypatch.setattr(foresight.atomic, "fsync_path", full)
    monkeypatch.setattr(training.checkpoint, "fsync_path", full)


@pytest.mark.parametrize("job", ["trace", "golden", "train", "eval"])
def test_a_full_disk_is_one_line_exit_2_and_leaves_nothing_half_written(inputs, small_disk, tmp_path, monkeypatch,
                                                                         capsys, job):
    """A full disk in `golden` or in an SL checkpoint was exit 1 "internal error" (exit 2 in `trace`), and the SL
    checkpoint left a `.tmp-step_*` behind."""
    if small_disk is None:
        out = tmp_path / "out"
        _simulate_full_disk(monkeypatch, out)
    else:
        out = small_disk / "out"
        _fill(small_disk, {"trace": 12_288, "golden": 8_192, "train": 20_480, "eval": 8_192}[job])
    assert main(_jobs(inputs, out)[job]) == 2
    err = _error_line(capsys.readouterr().err)
    assert "disk full writing" in err and str(out) in err, err
    leftovers = [p for p in out.rglob("*") if ".tmp" in p.name or p.name.startswith(".trash")] if out.exists() else []
    assert leftovers == []


@pytest.mark.parametrize("job", ["trace", "golden", "train", "eval"])
def test_out_of_memory_is_one_line_naming_the_size_exit_2(inputs, tmp_path, monkeypatch, capsys, job):
    """Out-of-memory was exit 1 "internal error"."""
    import evaluation.fidelity
    import golden.pipeline
    import golden.traces
    import training.sl

    def oom(*a, **k):
        if job == "train":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory: you "
                               "tried to allocate 123456789 bytes. Error code 12 (Cannot allocate memory)")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")

    target = {"trace": (golden.traces, "generate"), "golden": (golden.pipeline, "label_trace"),
              "train": (training.sl.SLTask, "loss"), "eval": (evaluation.fidelity, "replay")}[job]
    monkeypatch.setattr(*target, oom)
    assert main(_jobs(inputs, tmp_path / "out")[job]) == 2
    size = "123456789 bytes" if job == "train" else "2.00 GiB"
    assert f"error: out of memory (tried to allocate {size})" in _error_line(capsys.readouterr().err)


def test_the_error_directory_never_swallows_the_line(tmp_path, monkeypatch, capsys):
    """FORESIGHT_ERROR_DIR swallowed the error line from stderr: it is printed and recorded."""
    errors = tmp_path / "errors"
    errors.mkdir()
    monkeypatch.setenv(ERROR_DIR, str(errors))
    monkeypatch.setenv("RANK", "0")
    assert main(["trace", *TINY, "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "tr")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("foresight trace: error: problem file not found") and len(err.splitlines()) == 1
    assert (errors / "rank-0.txt").read_text() == err + "\n"
