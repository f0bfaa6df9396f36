"""Nothing of the user's is lost: every job writes only into a directory that is new, empty or its own kind's earlier
output (foresight/outputs.py), one writer at a time (foresight/run_lock.py); ``--overwrite`` replaces only its own
kind's output, never the current directory, a parent of it or a symbolic link's target."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from foresight.cli import main
from tests.conftest import run_in_progress, trace_dir

TINY = ["--model", "tiny-llama"]
MARKER = ".foresight-output.json"  # the marker file docs/reliability.md names


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def scorer_run(tmp_path, tiny_llama) -> Path:
    from foresight.models import model_fingerprint
    from foresight.scorer import Scorer, ScorerConfig

    Scorer(ScorerConfig(model_fingerprint(tiny_llama[0]), budget=16, interval=4, hidden=4), seed=0) \
        .save_pretrained(tmp_path / "run" / "scorer")
    return tmp_path / "run"


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    return trace_dir(tmp_path_factory.mktemp("outputs") / "traces")


def _bench(out: str) -> list[str]:
    return ["bench", *TINY, "--budget", "16", "--new-tokens", "4", "--repeats", "1", "--out", out]


# ---------------------------------------------------------------------------------------------------------------
# --overwrite replaces only an earlier output of its own kind
# ---------------------------------------------------------------------------------------------------------------


def test_export_overwrite_never_deletes_a_directory_it_did_not_write(scorer_run, traces, tmp_path, capsys):
    """`export --overwrite` deleted whatever --out was (a trace set here); it replaces only an earlier export."""
    import shutil

    victim = tmp_path / "traces"
    shutil.copytree(traces, victim)
    before = _tree(victim)
    assert main(["export", str(scorer_run), "--out", str(victim), "--overwrite"]) == 2
    assert "holds `trace` output" in _one_line(capsys) and _tree(victim) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    assert main(["export", str(scorer_run), "--out", str(mine), "--overwrite"]) == 2
    assert "notes.txt" in _one_line(capsys) and (mine / "notes.txt").read_text() == "my notes"


def test_export_overwrite_replaces_its_own_output_but_refuses_a_foreign_file_in_it(scorer_run, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(scorer_run), "--out", str(out)]) == 0
    assert json.loads((out / MARKER).read_text())["kind"] == "export"
    assert main(["export", str(scorer_run), "--out", str(out), "--overwrite"]) == 0
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["export", str(scorer_run), "--out", str(out), "--overwrite"]) == 2
    assert "--overwrite would delete" in _one_line(capsys) and (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("where", [".", ".."])
def test_export_overwrite_refuses_the_current_directory_and_its_parents(scorer_run, tmp_path, monkeypatch, capsys,
                                                                        where):
    """`export --out . --overwrite` wiped a project."""
    project = tmp_path / "project" / "sub"
    project.mkdir(parents=True)
    (project / "code.py").write_text("print('mine')")
    monkeypatch.chdir(project)
    assert main(["export", str(scorer_run), "--out", where, "--overwrite"]) == 2
    assert "current directory" in _one_line(capsys)
    assert (project / "code.py").read_text() == "print('mine')"


def test_export_overwrite_never_replaces_through_a_symlink(scorer_run, tmp_path, capsys):
    target = tmp_path / "export"
    assert main(["export", str(scorer_run), "--out", str(target)]) == 0
    before = _tree(target)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert main(["export", str(scorer_run), "--out", str(link), "--overwrite", "--note", "k=v"]) == 2
    assert "symbolic link" in _one_line(capsys) and _tree(target) == before and link.is_symlink()


def test_an_empty_out_is_refused(tmp_path, monkeypatch, capsys):
    """`--out ""` wrote into the current directory."""
    monkeypatch.chdir(tmp_path)
    assert main(_bench("")) == 2
    assert "--out is empty" in _one_line(capsys) and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# Files the tool did not write are refused by name
# ---------------------------------------------------------------------------------------------------------------


def test_a_users_own_files_in_out_are_refused_by_name(traces, tmp_path, capsys):
    """`eval fidelity`, `eval aime` and `bench` replaced the user's own fidelity.md, summary.json, bench.json."""
    cases = {
        "fidelity.md": ["eval", "fidelity", *TINY, "--traces", str(traces), "--policies", "full,random", "--budget",
                        "16", "--interval", "4", "--quiet", "--out"],
        "summary.json": ["eval", "aime", *TINY, "--data", "synthetic", "--limit", "1", "--max-new-tokens", "4",
                         "--quiet", "--out"],
        "bench.json": _bench("")[:-1],
    }
    for name, argv in cases.items():
        out = tmp_path / name.split(".")[0]
        out.mkdir()
        (out / name).write_text("the user's own\n")
        assert main([*argv, str(out)]) == 2, name
        assert name in _one_line(capsys)
        assert [p.name for p in out.iterdir()] == [name] and (out / name).read_text() == "the user's own\n"


def test_an_output_made_before_markers_is_adopted(traces, tmp_path):
    """A directory written before output markers existed (its files only, no marker) is resumed and marked."""
    import shutil

    old = tmp_path / "traces"
    shutil.copytree(traces, old)
    (old / MARKER).unlink()
    trace_dir(old)  # the same command resumes it
    assert json.loads((old / MARKER).read_text())["kind"] == "trace"


def test_stale_temporaries_are_removed_on_the_next_run(tmp_path):
    """Temporaries of killed writes (a dead writer's pid) inside and beside --out go; a live writer's stay."""
    out = tmp_path / "bench"
    assert main(_bench(str(out))) == 0
    dead = 2**22 + 12345  # above the largest pid Linux gives (pid_max <= 2^22)
    stale = [out / f".bench.json.tmp-{dead}-ab12", tmp_path / f".bench.tmp-{dead}-cd34",
             tmp_path / f".bench.old-{dead}-ef56"]
    live = tmp_path / f".bench.tmp-{os.getppid()}-0123"
    for p in [*stale[:2], live]:
        p.write_text("partial")
    stale[2].mkdir()
    (stale[2] / "f").write_text("old")
    assert main(_bench(str(out))) == 0
    assert not any(p.exists() for p in stale) and live.exists()
    assert {p.name for p in out.iterdir()} == {MARKER, "bench.json", "bench.md"}


# ---------------------------------------------------------------------------------------------------------------
# One writer per output directory
# ---------------------------------------------------------------------------------------------------------------


def test_a_second_run_on_an_out_in_use_is_refused(tmp_path, capsys):
    """Two `eval aime` runs on one --out left 90 records for 48 samples: the second is refused at once."""
    out = tmp_path / "aime"
    with run_in_progress(out):
        assert main(["eval", "aime", *TINY, "--data", "synthetic", "--limit", "1", "--max-new-tokens", "4", "--quiet",
                     "--out", str(out)]) == 2
    assert f"--out {out} is in use by another" in _one_line(capsys) and not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# A finished run is refused without --resume or --overwrite, whether it kept checkpoints or not
# ---------------------------------------------------------------------------------------------------------------


def test_a_finished_run_without_checkpoints_is_refused(tmp_path, capsys):
    from tests.training.test_sl import REPO, _make_data

    traces, labels = _make_data(tmp_path / "data", n=4)
    out = tmp_path / "run"
    argv = ["train", "sl", "--config", str(REPO / "configs" / "sl.yaml"), "model=tiny-llama", f"traces={traces}",
            f"labels={labels}", "budget=16", "interval=4", "heldout=1", "steps=2", "micro_batch=2", "warmup_steps=0",
            "checkpoint_every=0", "log_every=1", "eval_every=0", "eval_fidelity=false", f"out_dir={out}",
            "device=cpu", f"deepspeed={REPO / 'configs' / 'deepspeed' / 'zero0.json'}"]
    assert main(argv) == 0
    assert not (out / "checkpoints").exists()
    before = _tree(out / "scorer")
    capsys.readouterr()
    assert main([*argv, "lr=0.5"]) == 2
    err = _one_line(capsys)
    assert "holds an earlier run" in err and "--overwrite" in err and _tree(out / "scorer") == before
    assert main([*argv, "lr=0.5", "--resume", "--overwrite"]) == 2
    assert main([*argv, "lr=0.5", "--overwrite"]) == 0
    assert _tree(out / "scorer") != before
    cfg = json.loads((out / "scorer" / "config.json").read_text())
    assert cfg["provenance"]["config"]["lr"] == 0.5
