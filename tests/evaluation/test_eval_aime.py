"""``foresight eval aime``: resumable per-sample JSONL, summary, sharding and settings checks (tiny model, CPU)."""

from __future__ import annotations

import json

import pytest

from evaluation.accuracy import TIMING_FIELDS, read_records
from foresight.cli import main
from tests.conftest import Killed, kill_while_writing

PROBLEMS = [
    {"id": "a", "problem": "What is 1+1?", "answer": "2"},
    {"id": "b", "problem": "Compute 3 times 4, then add five.", "answer": "17"},
    {"id": "c", "problem": "Half of 9?", "answer": "\\frac{9}{2}"},
]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return path


def _run(data, out, *extra):
    argv = ["eval", "aime", "--model", "tiny-llama", "--data", str(data), "--policy", "streaming_llm", "--budget", "48",
            "--interval", "8", "--samples", "2", "--temperature", "0.8", "--max-new-tokens", "24",
            "--batch-size", "2", "--out", str(out), "--quiet", *extra]
    return main(argv)


def _summary(out) -> dict:
    s = json.loads((out / "summary.json").read_text())
    for k in TIMING_FIELDS:
        s.pop(k)
    return s


def _texts(out) -> dict:
    return {(r["problem_id"], r["sample"]): (r["text"], r["generated_tokens"]) for r in read_records(out)}


def test_summary_and_records(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(data, out) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] and s["samples"] == s["expected_samples"] == 6 and s["problems"] == 3
    assert s["mean_generated_tokens"] == 24  # tiny random model never stops early here
    assert 0 <= s["pass@1"] <= 1 and set(s["per_problem"]) == {"a", "b", "c"}
    assert s["peak_kv_entries"] >= 48 and s["tokens_per_s"] > 0
    assert s["settings"]["policy"] == "streaming_llm" and s["settings"]["budget"] == 48
    # no --top-p / --top-k records the defaults (resume compares)
    assert (s["settings"]["top_p"], s["settings"]["top_k"]) == (0.95, 20)
    recs = read_records(out)
    assert {(r["problem_id"], r["sample"]) for r in recs} == {(p["id"], i) for p in PROBLEMS for i in range(2)}
    assert all(set(r) >= {"extracted", "correct", "generated_tokens", "peak_kv_entries"} for r in recs)
    assert "pass@1" in capsys.readouterr().out


def test_greedy_samples_are_refused_before_the_model_loads(data, tmp_path, capsys, monkeypatch):
    """--temperature 0 --samples 2 generated two identical greedy answers per problem and counted them as two
    samples in pass@1 (and per-problem accuracy): one line, exit 2, before the model loads or --out is made."""
    import foresight
    from evaluation.accuracy import run_accuracy
    from foresight.errors import ForesightError

    out = tmp_path / "greedy"
    with monkeypatch.context() as m:
        m.setattr(foresight, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
        for samples in ("2", "5"):
            assert _run(data, out, "--temperature", "0", "--samples", samples) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1, err
            assert f"--samples {samples} with --temperature 0" in err and "identical" in err, err
            assert not out.exists()
        with pytest.raises(ForesightError, match="--samples 3 with --temperature 0"):  # the library, too
            run_accuracy(None, None, [], out, policy=None, settings={"temperature": 0}, samples=3)
        assert not out.exists()
    # one greedy sample, and several sampled ones, are fine; greedy records the default filters (resume compares)
    assert _run(data, out, "--temperature", "0", "--samples", "1", "--limit", "1") == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["samples"] == 1 and (s["settings"]["temperature"], s["settings"]["top_p"], s["settings"]["top_k"]) \
        == (0, 0.95, 20)


def test_kill_and_resume_gives_the_same_summary(data, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert _run(data, full) == 0
    assert _run(data, cut) == 0
    # Simulate kill -9 mid-write: keep one whole record and half of the next one.
    path = cut / "samples-rank0.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    (cut / "summary.json").unlink()
    assert _run(data, cut) == 0
    assert len(path.read_text().splitlines()) == 6  # partial line cut, 5 regenerated
    assert all(json.loads(line) for line in path.read_text().splitlines())
    assert _summary(cut) == _summary(full)
    assert _texts(cut) == _texts(full)
    # A rerun of a finished run generates nothing.
    before = path.read_text()
    assert _run(data, cut) == 0
    assert path.read_text() == before


def test_sharding_across_ranks_merges(data, tmp_path, monkeypatch):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert _run(data, single) == 0
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        assert _run(data, sharded) == 0
    assert (sharded / "samples-rank0.jsonl").exists() and (sharded / "samples-rank1.jsonl").exists()
    assert _summary(sharded)["per_problem"] == _summary(single)["per_problem"]
    assert _texts(sharded) == _texts(single)
    assert _summary(sharded)["complete"]


def test_sampling_does_not_depend_on_batch_composition(data, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert _run(data, a, "--temperature", "0.8", "--top-k", "0", "--top-p", "1.0", "--batch-size", "1") == 0
    assert _run(data, b, "--temperature", "0.8", "--top-k", "0", "--top-p", "1.0", "--batch-size", "4") == 0
    assert _texts(a) == _texts(b)
    texts = [t for t, _ in _texts(a).values()]
    assert len(set(texts)) == len(texts)  # samples of one problem differ


def test_refuses_to_mix_settings(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(data, out, "--limit", "1") == 0
    assert _run(data, out, "--limit", "1", "--max-new-tokens", "30") == 2
    assert "other settings" in capsys.readouterr().err
    # samples whose settings.json is gone: they were reused under any other policy (labelled as it)
    (out / "settings.json").unlink()
    before = sorted((p.name, p.read_bytes()) for p in out.glob("samples-rank*.jsonl"))
    assert _run(data, out, "--limit", "1", "--max-new-tokens", "30") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "holds samples but no settings.json" in err, err
    assert sorted((p.name, p.read_bytes()) for p in out.glob("samples-rank*.jsonl")) == before


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policy", "nope"], "unknown policy"),
        (["--policy", "learned"], "needs --scorer"),
        (["--policy", "golden"], "cannot generate"),
        (["--budget", "8"], "interval"),
    ],
)
def test_error_paths(data, tmp_path, capsys, extra, message):
    assert _run(data, tmp_path / "x", *extra) == 2
    assert message in capsys.readouterr().err



def test_refuses_samples_of_problems_edited_under_the_same_ids(data, tmp_path, capsys):
    """The data file (or template file) behind a run edited under the same ids: resuming would summarise samples
    graded against other problems, so it is refused naming the problem, and nothing is written."""
    out, template = tmp_path / "run", tmp_path / "template.txt"
    template.write_text("Solve: {problem}\n")
    assert _run(data, out, "--limit", "2", "--template", str(template)) == 0
    files = {f.name: f.read_bytes() for f in out.iterdir()}
    edits = [
        ([dict(PROBLEMS[0], answer="3"), *PROBLEMS[1:]], "Solve: {problem}\n", ("'a'", "'2' there, '3' now")),
        ([PROBLEMS[0], dict(PROBLEMS[1], problem="Compute 4 times 3, then add five."), PROBLEMS[2]],
         "Solve: {problem}\n", ("'b'", "another prompt")),
        (PROBLEMS, "Answer: {problem}\n", ("'a'", "another prompt")),
    ]
    for problems, text, names in edits:
        data.write_text("".join(json.dumps(p) + "\n" for p in problems))
        template.write_text(text)
        assert _run(data, out, "--limit", "2", "--template", str(template)) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(data) in err and all(n in err for n in names), err
        assert {f.name: f.read_bytes() for f in out.iterdir()} == files


def _scorer(tmp_path, seed):
    import foresight
    from foresight.scorer import Scorer, ScorerConfig
    from tests.conftest import get_model

    model, _ = get_model("tiny-llama")
    sc = Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=48, interval=8, hidden=8), seed=seed)
    return sc.save_pretrained(tmp_path / f"scorer{seed}")


def test_refuses_samples_of_another_scorer_or_model(data, tmp_path, capsys):
    """Finished samples made with another scorer's weights (another --scorer, or the same directory holding new
    weights) or another model (--adapter) are refused, not summarised as this run's pass@1; nothing is written."""
    from tests.conftest import save_random_adapter

    out = tmp_path / "run"
    learned = ["--limit", "1", "--policy", "learned", "--scorer"]
    first, second = _scorer(tmp_path, 0), _scorer(tmp_path, 1)
    assert _run(data, out, *learned, str(first)) == 0
    files = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()
    assert _run(data, out, *learned, str(second)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "other settings" in err and "scorer" in err, err
    (first / "model.safetensors").write_bytes((second / "model.safetensors").read_bytes())  # new weights, same dir
    assert _run(data, out, *learned, str(first)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scorer_sha256" in err, err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == files

    base = tmp_path / "base"
    assert _run(data, base, "--limit", "1") == 0
    capsys.readouterr()
    adapter = save_random_adapter(tmp_path / "lora")
    assert _run(data, base, "--limit", "1", "--adapter", str(adapter)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "adapter: none vs LORA" in err, err
    # samples of float32 weights are not mixed with bfloat16 ones (--dtype's default differs by device; tiny models
    # always load in float32, so the recorded dtype is edited as a bfloat16 run would have written it)
    from evaluation.accuracy import _check_settings
    from foresight.errors import ForesightError

    settings = json.loads((base / "settings.json").read_text())
    assert settings["dtype"] == "float32"
    _check_settings(base, settings)  # the same settings pass
    with pytest.raises(ForesightError, match="dtype: 'float32' -> 'bfloat16'"):
        _check_settings(base, {**settings, "dtype": "bfloat16"})
    _check_settings(base, {k: v for k, v in settings.items() if k != "dtype"})  # a run that did not record it


@pytest.mark.parametrize("rows, message", [
    ([PROBLEMS[0], {"id": "q", "problem": "What is 2+2?", "Answer": "4"}], "problem 'q' has no reference answer"),
    ([], "no problems"),
])
def test_refuses_problems_it_cannot_grade(tmp_path, capsys, rows, message):
    """A problem without a reference answer (e.g. a file naming it `Answer` or `solution`) was graded wrong on every
    sample, so pass@1 read 0% with exit 0, and an empty problem file gave pass@1 n/a with exit 0: both are one line,
    exit 2, before the model loads or anything is written."""
    data, out = tmp_path / "problems.jsonl", tmp_path / "run"
    data.write_text("".join(json.dumps(p) + "\n" for p in rows))
    assert _run(data, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(data) in err, err
    assert not out.exists()


def test_a_rerun_killed_while_rewriting_settings_resumes(data, tmp_path, monkeypatch):
    # every rerun rewrites settings.json: a kill -9 in that write must not leave --out refusing every later rerun
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert _run(data, full) == 0
    assert _run(data, cut) == 0
    (cut / "summary.json").unlink()
    kill_while_writing(monkeypatch, "settings.json")
    with pytest.raises(Killed):
        _run(data, cut)
    monkeypatch.undo()
    assert _run(data, cut) == 0
    assert _summary(cut) == _summary(full)


def test_the_scorer_may_be_given_as_generate_takes_it(data, tmp_path, capsys):
    """``--policy-arg scorer=DIR`` (``foresight generate``'s spelling) is ``--scorer DIR``: the same run and record."""
    scorer = _scorer(tmp_path, 0)
    learned = ["--limit", "1", "--policy", "learned"]
    assert _run(data, tmp_path / "a", *learned, "--scorer", str(scorer)) == 0
    assert _run(data, tmp_path / "b", *learned, "--policy-arg", f"scorer={scorer}") == 0
    assert _summary(tmp_path / "a")["settings"] == _summary(tmp_path / "b")["settings"]
    assert _texts(tmp_path / "a") == _texts(tmp_path / "b")
    capsys.readouterr()
    assert _run(data, tmp_path / "c", *learned, "--scorer", str(scorer), "--policy-arg", f"scorer={scorer}") == 2
    assert "give the scorer once" in capsys.readouterr().err and not (tmp_path / "c").exists()
