"""``foresight launch``: a command on N local ranks with the command line's contract kept (one error line, exit 2 for
a refused input, no launcher traceback), where a bare ``torchrun`` adds its own report and exits 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from foresight.cli import ERROR_DIR, report
from foresight.cli.commands.launch import _report_failure
from training.distributed import _free_port

REPO = Path(__file__).resolve().parents[2]


def _launch(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.pop(ERROR_DIR, None)
    return subprocess.run([sys.executable, "-m", "foresight", "launch", "--master-port", str(_free_port()), *argv],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _error_lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if "error" in x.lower()]


def test_a_refused_input_on_every_rank_is_one_line_and_exit_2(tmp_path):
    out = _launch("--nproc-per-node", "2", "train", "sl", "--config", "configs/sl.yaml", "model=tiny-llama",
                  f"traces={tmp_path / 'missing'}", f"labels={tmp_path / 'missing'}", f"out_dir={tmp_path / 'run'}")
    assert out.returncode == 2, out.stderr
    assert _error_lines(out.stderr) == [f"foresight train: error: trace directory not found: {tmp_path / 'missing'}"]
    assert "Traceback" not in out.stderr and "ChildFailedError" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_a_usage_error_is_refused_before_any_rank_starts():
    out = _launch("train", "sl", "--no-such-option")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["foresight: error: unrecognized arguments: --no-such-option"]
    for argv, what in ((["launch", "policies"], "launch the command itself"), ([], "give the command")):
        out = _launch(*argv)
        assert out.returncode == 2 and what in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_command_runs_on_every_rank():
    out = _launch("--nproc-per-node", "2", "policies")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("streaming_llm") == 2  # each rank printed the listing


def _failure(rank: int, exitcode: int):
    return SimpleNamespace(get_first_failure=lambda: (rank, SimpleNamespace(exitcode=exitcode)))


def test_the_exit_status_follows_the_first_failure(tmp_path, capsys):
    (tmp_path / "rank-1.txt").write_text("foresight train: error: x\n")
    (tmp_path / "rank-0.txt").write_text("foresight train: error: x\nforesight train: error: y\n")
    assert _report_failure(_failure(0, 2), tmp_path) == 2  # ranks stopped after it are its consequence
    assert capsys.readouterr().err == ""  # the ranks printed their lines themselves
    assert _report_failure(_failure(1, 1), tmp_path) == 1  # an internal error: its line, status 1
    empty = tmp_path / "none"
    empty.mkdir()
    assert _report_failure(_failure(1, -9), empty) == 1  # killed before it could say anything
    assert capsys.readouterr().err.splitlines()[-1] == ("foresight launch: error: rank 1 failed first (killed by "
                                                       "signal 9; see its output above)")


def test_report_prints_and_records_in_a_rank(tmp_path, monkeypatch, capsys):
    """FORESIGHT_ERROR_DIR never swallows the line: it is printed and recorded; a line another rank already said is
    recorded only (one line for a refusal every rank meets)."""
    report("plain")
    assert capsys.readouterr().err == "plain\n"
    monkeypatch.setenv(ERROR_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    report("in a rank")
    assert capsys.readouterr().err == "in a rank\n" and (tmp_path / "rank-3.txt").read_text() == "in a rank\n"
    monkeypatch.setenv("RANK", "1")
    report("in a rank")
    report("another")
    assert capsys.readouterr().err == "another\n"
    assert (tmp_path / "rank-1.txt").read_text() == "in a rank\nanother\n"


@pytest.mark.parametrize("port", ["0", "70000", "x"])
def test_a_bad_port_is_one_line(port):
    out = subprocess.run([sys.executable, "-m", "foresight", "launch", "--master-port", port, "policies"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "--master-port" in out.stderr


def test_a_signal_to_the_launcher_is_one_line_and_128_plus_its_number(monkeypatch, capsys):
    import signal

    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from foresight.cli.commands.launch import run

    def stopped(_args):
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(torch.distributed.run, "run", stopped)
    code = run(SimpleNamespace(argv=["policies"], nproc_per_node=2, master_port=_free_port(), verbose=False))
    assert code == 143
    assert capsys.readouterr().err.splitlines() == [
        "foresight launch: interrupted by SIGTERM; the ranks were stopped (a resumable command continues with "
        "--resume)"]
