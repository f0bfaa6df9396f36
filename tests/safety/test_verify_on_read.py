"""Nothing read back is trusted blindly: shards against their manifests' SHA-256, checkpoint steps against their
directory, fidelity journal records against their checksums, AIME samples regraded, plan paths kept inside their
directory, YAML keys given once."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from foresight.cli import main
from foresight.errors import ForesightError
from tests.conftest import trace_dir

TINY = ["--model", "tiny-llama"]
B, W = 16, 4


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    return trace_dir(tmp_path_factory.mktemp("verify") / "traces")


def _flip_a_token(traces: Path) -> tuple[int, int, int]:
    """Change one token id of the first trace in its Arrow file in place (same size); returns (position, old, new)."""
    from golden.traces import load_traces

    ids = load_traces(traces)[0]["input_ids"]
    arrow = next((traces / "shards").rglob("*.arrow"))
    data = bytearray(arrow.read_bytes())
    for i in range(len(ids) - 4, 0, -1):  # a window of four generated tokens found once in the file
        window = struct.pack("<4i", *ids[i : i + 4])
        at = data.find(window)
        if at >= 0 and data.find(window, at + 1) < 0:
            break
    new = (ids[i + 1] + 1) % 250 + 3
    data[at + 4 : at + 8] = struct.pack("<i", new)
    arrow.write_bytes(bytes(data))
    return i + 1, ids[i + 1], new


def test_a_trace_shard_with_one_token_flipped_is_refused(traces, tmp_path, capsys):
    """The manifests record SHA-256, but readers checked sizes only: `golden` labelled and `eval fidelity` scored a
    shard with a token flipped (same size), exit 0."""
    import datasets

    bad = tmp_path / "traces"
    shutil.copytree(traces, bad)
    at, old, new = _flip_a_token(bad)
    shard = next(p for p in (bad / "shards").iterdir() if not p.name.startswith("."))
    assert datasets.load_from_disk(str(shard))[0]["input_ids"][at] == new != old  # the flip is a real token change
    for argv in (["golden", *TINY, "--traces", str(bad), "--out", str(tmp_path / "labels"), "--budget", str(B),
                  "--interval", str(W), "--no-progress"],
                 ["eval", "fidelity", *TINY, "--traces", str(bad), "--policies", "full,random", "--budget", str(B),
                  "--interval", str(W), "--quiet", "--out", str(tmp_path / "fid")]):
        assert main(argv) == 2
        err = _one_line(capsys)
        assert str(shard) in err and "SHA-256" in err, err
    assert not (tmp_path / "labels").exists() and not (tmp_path / "fid").exists()


def test_a_plan_never_points_outside_its_directory(traces, tmp_path, capsys):
    """A plan.json shard path `../../elsewhere` was read from outside --traces (`<traces>/shards/../../elsewhere`,
    a shard planted beside --traces, was scored, exit 0)."""
    bad = tmp_path / "set" / "traces"
    shutil.copytree(traces, bad)
    elsewhere = bad / "shards" / ".." / ".." / "elsewhere"  # = tmp_path/set/elsewhere: outside --traces
    shutil.copytree(next(p for p in (bad / "shards").iterdir() if not p.name.startswith(".")), elsewhere)
    plan = json.loads((bad / "plan.json").read_text())
    plan["units"][0]["shard"] = "../../elsewhere"
    (bad / "plan.json").write_text(json.dumps(plan))
    assert main(["eval", "fidelity", *TINY, "--traces", str(bad), "--policies", "full", "--budget", str(B),
                 "--interval", str(W), "--quiet", "--out", str(tmp_path / "fid")]) == 2
    err = _one_line(capsys)
    assert "'../../elsewhere' is not a file name inside" in err and str(bad / "plan.json") in err


def test_an_edited_checkpoint_step_is_refused(tmp_path, capsys):
    """A checkpoint.json with "step": -5 or 1e30 was resumed from that step."""
    from tests.safety.test_resume_safety import _cli
    from tests.training.test_sl import _make_data

    data = _make_data(tmp_path / "data", n=4)
    out = tmp_path / "run"
    assert main(_cli(data, out, "max_steps_per_run=4")) == 0
    capsys.readouterr()
    manifest = out / "checkpoints" / "step_000004" / "checkpoint.json"
    good = json.loads(manifest.read_text())
    for step in (-5, 1e30, 2, True):
        manifest.write_text(json.dumps({**good, "step": step}))
        assert main(_cli(data, out, "--resume")) == 2
        err = _one_line(capsys)
        assert f"records step {step!r}" in err and "step_000004" in err, err
    manifest.write_text(json.dumps({**good, "skipped": 7}))
    assert main(_cli(data, out, "--resume")) == 2
    assert "7 skipped steps" in _one_line(capsys)
    manifest.write_text(json.dumps(good))
    assert main(_cli(data, out, "--resume")) == 0


def test_an_edited_fidelity_journal_record_is_refused(tmp_path, tiny_llama):
    """One per-trace number edited in a fidelity journal was reported (h2o 3.06 instead of 1.01)."""
    from evaluation.fidelity import evaluate_fidelity

    model, _ = tiny_llama
    seqs = [list(range(3, 3 + 40)), list(range(50, 50 + 44))]
    journal = tmp_path / "fidelity.partial.jsonl"
    clean = evaluate_fidelity(model, seqs, ["h2o"], [B], W, trace_ids=["a", "b"], journal=journal)
    lines = journal.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["policies"][f"h2o@{B}"]["rows"][0][1] *= 3  # the second batch's summed CE under h2o, tripled
    journal.write_text("\n".join([*lines[:2], json.dumps(rec)]) + "\n")
    with pytest.raises(ForesightError, match="line 3 was changed since it was written"):
        evaluate_fidelity(model, seqs, ["h2o"], [B], W, trace_ids=["a", "b"], journal=journal)
    journal.write_text("\n".join(lines) + "\n")
    assert evaluate_fidelity(model, seqs, ["h2o"], [B], W, trace_ids=["a", "b"], journal=journal) == clean


def test_edited_aime_grades_are_regraded(tmp_path, capsys):
    """Edited `correct` flags in AIME samples were reported as 100% pass@1."""
    out = tmp_path / "aime"
    argv = ["eval", "aime", *TINY, "--data", "synthetic", "--limit", "2", "--max-new-tokens", "6", "--quiet", "--out",
            str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass@1"] == 0.0  # a tiny random model answers nothing
    samples = out / "samples-rank0.jsonl"
    recs = [json.loads(x) for x in samples.read_text().splitlines()]
    samples.write_text("".join(json.dumps({**r, "correct": True, "extracted": r["answer"]}) + "\n" for r in recs))
    capsys.readouterr()
    assert main(argv) == 0
    assert json.loads((out / "summary.json").read_text())["pass@1"] == 0.0
    assert "2 sample record(s) held another grade" in capsys.readouterr().err


def test_a_yaml_key_given_twice_is_an_error(tmp_path, capsys):
    """A YAML key given twice took the last value without a word."""
    from foresight.config import read_yaml_mapping

    cfg = tmp_path / "sl.yaml"
    cfg.write_text("lr: 0.1\nsteps: 3\nlr: 0.5\n")
    with pytest.raises(ForesightError, match=r"sl.yaml:3: invalid YAML \(key 'lr' given twice, first on line 1\)"):
        read_yaml_mapping(cfg)
    assert main(["train", "sl", "--config", str(cfg)]) == 2
    assert "key 'lr' given twice" in _one_line(capsys)
    merged = tmp_path / "merge.yaml"  # a merge key's values may be overridden: that is not a key given twice
    merged.write_text("base: &b {lr: 0.1, steps: 2}\nrun:\n  <<: *b\n  lr: 0.3\n")
    assert read_yaml_mapping(merged)["run"] == {"lr": 0.3, "steps": 2}
