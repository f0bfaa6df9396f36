"""Problems, prompts, traces (determinism, rank sharding, kill-and-resume) and the golden CLI's error paths."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from foresight.cli import main as cli_main
from foresight.data import DataError, load_problems, synthetic_problems
from foresight.errors import ForesightError
from foresight.prompts import DEFAULT_TEMPLATE, build_prompt
from golden.labels import load_labels
from golden.pipeline import label_traces
from golden.traces import generate_traces, load_traces, trace_progress
from tests.conftest import get_model

REPO = Path(__file__).resolve().parents[2]
SETTINGS = dict(samples=2, max_new_tokens=24, temperature=0.8, top_p=0.95, top_k=20, batch_size=3, progress=False)


# -- problems and prompts -----------------------------------------------------------------------------------------


def test_builtin_problem_sets(monkeypatch, tmp_path):
    # Shipped inside the package: found with no ../shared and no FORESIGHT_DATA_DIR.
    monkeypatch.delenv("FORESIGHT_DATA_DIR", raising=False)
    from foresight.data import data_dir

    assert data_dir().is_relative_to(REPO / "foresight")
    aime = load_problems("aime24")
    assert len(aime) == 30 and all(p.problem and p.answer for p in aime)
    assert len({p.id for p in aime}) == 30
    math = load_problems("math500", limit=5)
    assert len(math) == 5 and math[0].id.startswith("test/")
    assert len(load_problems("aime25", limit=0)) == 0
    assert len(load_problems("aime25")) == 30 and len(load_problems("math500")) == 400
    # FORESIGHT_DATA_DIR still overrides the shipped copies.
    (tmp_path / "aime24.jsonl").write_text('{"problem": "1+1?", "answer": "2", "id": "x"}\n')
    monkeypatch.setenv("FORESIGHT_DATA_DIR", str(tmp_path))
    assert [p.id for p in load_problems("aime24")] == ["x"]


def test_missing_data_dir_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("FORESIGHT_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match="FORESIGHT_DATA_DIR"):
        load_problems("aime24")
    with pytest.raises(DataError, match="not found"):
        load_problems(str(tmp_path / "nope.jsonl"))


def test_jsonl_problems(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"problem": "1+1?", "answer": 2}\n\n{"question": "2+2?", "id": "q"}\n')
    ps = load_problems(str(f))
    assert [(p.id, p.problem, p.answer) for p in ps] == [("0", "1+1?", "2"), ("q", "2+2?", "")]
    f.write_text('{"problem": "a", "id": 1}\n{"problem": "b", "id": 1}\n')
    with pytest.raises(DataError, match="duplicate"):
        load_problems(str(f))
    f.write_text('{"text": "a"}\n')
    with pytest.raises(DataError, match="problem"):
        load_problems(str(f))
    # refused naming the file (and line or record), where they gave an encoding error without the file, an empty
    # set, or a prompt / reference answer made of a value's repr (graded wrong every time)
    for content, message in [(b'{"problem": "a"}\n{"problem": "b\xe9"}\n', r"p.jsonl:2: not UTF-8"),
                             (b"", "p.jsonl: no problems"), (b"\n \n", "p.jsonl: no problems"),
                             (b'{"problem": ["a", "b"]}\n', "record 0: `problem` must be non-empty text"),
                             (b'{"problem": "  "}\n', "record 0: `problem` must be non-empty text"),
                             (b'{"problem": "a", "answer": ["2", "3"]}\n', "`answer` must be a text or a num"),
                             (b'{"problem": "a", "answer": true}\n', "record 0: `answer` must be a text or a number")]:
        f.write_bytes(content)
        with pytest.raises(DataError, match=message):
            load_problems(str(f))


def test_synthetic_problems_are_deterministic_and_correct():
    a, b = synthetic_problems(12), synthetic_problems(12)
    assert a == b and len({p.id for p in a}) == 12
    assert load_problems("synthetic", limit=5) == a[:5]
    p = a[0]  # "X has a ... buys b packs with c ... gives away g": answer = a + b*c - g
    nums = [int(t) for t in p.problem.replace(".", " ").replace(",", " ").split() if t.isdigit()]
    assert int(p.answer) == nums[0] + nums[1] * nums[2] - nums[3]


def test_build_prompt(tmp_path):
    _, tok = get_model("tiny-llama")
    text = build_prompt(tok, "What is 2+3?")
    assert text.startswith("<|im_start|>user\nWhat is 2+3?") and text.endswith("<|im_start|>assistant\n")
    assert "\\boxed{}" in text and DEFAULT_TEMPLATE.replace("{problem}", "What is 2+3?") in text
    tpl = tmp_path / "t.txt"
    tpl.write_text("Solve: {problem} Answer in \\boxed{}.")
    assert "Solve: 7*6 Answer in \\boxed{}." in build_prompt(tok, "7*6", str(tpl))
    with pytest.raises(ForesightError, match="placeholder"):
        build_prompt(tok, "x", "no placeholder here")


def test_load_template_tells_a_missing_file_from_text(tmp_path):
    from foresight.prompts import load_template

    for text in ("Solve {problem}", "See a/b: {problem}", "{problem} in notes.txt", "x\n{problem}"):
        assert load_template(text) == text  # text with the placeholder is never read as a path
    for path in (tmp_path / "nope.txt", "prompts/nope", "nope.jinja", "~/nope"):
        with pytest.raises(ForesightError, match="not found"):
            load_template(str(path))
    with pytest.raises(ForesightError, match="is not a file"):
        load_template(str(tmp_path))
    (tmp_path / "bare.txt").write_text("no placeholder\n")
    with pytest.raises(ForesightError, match="bare.txt must contain"):
        load_template(str(tmp_path / "bare.txt"))
    for text in ("Solve it", "a" * 300):  # one-line text without the placeholder: the placeholder is asked for
        with pytest.raises(ForesightError, match="must contain the placeholder"):
            load_template(text)


# -- traces --------------------------------------------------------------------------------------------------------


def _rows(ds):
    return {r["trace_id"]: r["input_ids"] for r in ds}


def test_traces_columns_and_seed_determinism(tmp_path):
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=3)
    a = load_traces(generate_traces(model, tok, problems, tmp_path / "a", seed=1, **SETTINGS))
    b = load_traces(generate_traces(model, tok, problems, tmp_path / "b", seed=1, **SETTINGS))
    c = load_traces(generate_traces(model, tok, problems, tmp_path / "c", seed=2, **SETTINGS))
    for col in ["trace_id", "problem_id", "sample", "input_ids", "prompt_len", "answer", "settings", "fingerprint"]:
        assert col in a.column_names
    assert a["trace_id"] == [f"synthetic-{i}#{s}" for i in range(3) for s in range(2)]
    assert _rows(a) == _rows(b)
    assert _rows(a) != _rows(c)
    row = a[0]
    assert len(row["input_ids"]) == row["prompt_len"] + 24
    assert row["input_ids"][: row["prompt_len"]] == tok(build_prompt(tok, problems[0].problem))["input_ids"]
    assert row["answer"] == problems[0].answer
    assert json.loads(row["settings"])["seed"] == 1 and json.loads(row["fingerprint"])["model"] == "tiny-llama"
    # the two samples of one problem differ; a trace does not depend on its batch neighbours
    assert a[0]["input_ids"] != a[1]["input_ids"]
    d = load_traces(generate_traces(model, tok, problems[1:], tmp_path / "d", seed=1, **SETTINGS))
    assert _rows(d)["synthetic-2#1"] == _rows(a)["synthetic-2#1"]


def test_first_sample_adds_the_next_samples_of_a_set(tmp_path):
    # samples 1.. of a two-sample set, made on their own: same ids, seeds and tokens; sample 0 is not redone
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=2)
    both = _rows(load_traces(generate_traces(model, tok, problems, tmp_path / "both", seed=1, **SETTINGS)))
    settings = dict(SETTINGS, samples=1)
    more = load_traces(generate_traces(model, tok, problems, tmp_path / "more", seed=1, first_sample=1, **settings))
    assert more["trace_id"] == ["synthetic-0#1", "synthetic-1#1"] and more["sample"] == [1, 1]
    assert _rows(more) == {t: ids for t, ids in both.items() if t.endswith("#1")}
    assert json.loads(more[0]["settings"])["first_sample"] == 1
    # a set made without it records no such key (the sets made before it existed resume unchanged)
    assert "first_sample" not in json.loads(load_traces(tmp_path / "both")[0]["settings"])
    with pytest.raises(ForesightError, match="first_sample"):
        generate_traces(model, tok, problems, tmp_path / "bad", seed=1, first_sample=-1, **settings)
    assert not (tmp_path / "bad").exists()


def test_greedy_traces_of_several_samples_are_refused(tmp_path, monkeypatch, capsys):
    """temperature 0 with samples > 1 wrote identical greedy copies of each trace under distinct ids (problem#0,
    problem#1, ...), counted as independent samples: refused (one line, exit 2) before the model loads."""
    import foresight

    with monkeypatch.context() as m:
        m.setattr(foresight, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
        rc = cli_main(["trace", "--model", "tiny-llama", "--data", "synthetic", "--limit", "2", "--samples", "3",
                       "--temperature", "0", "--out", str(tmp_path / "cli"), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "--samples 3 with --temperature 0" in err and "identical" in err, err
        assert not (tmp_path / "cli").exists()
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=2)
    with pytest.raises(ForesightError, match="samples=2 with temperature=0"):  # the library, too
        generate_traces(model, tok, problems, tmp_path / "lib", seed=0, **dict(SETTINGS, temperature=0))
    assert not (tmp_path / "lib").exists()
    greedy = dict(SETTINGS, temperature=0, samples=1, max_new_tokens=4)  # one greedy trace per problem is fine
    assert len(load_traces(generate_traces(model, tok, problems, tmp_path / "one", seed=0, **greedy))) == 2


def test_greedy_traces_after_the_first_sample_are_refused(tmp_path, monkeypatch, capsys):
    """--first-sample K > 0 at temperature 0 wrote an exact copy of sample 0 under the id problem#K, which the docs
    suggest training on together with the first set: refused (one line, exit 2) before the model loads."""
    import foresight

    with monkeypatch.context() as m:
        m.setattr(foresight, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
        rc = cli_main(["trace", "--model", "tiny-llama", "--data", "synthetic", "--limit", "2", "--first-sample", "1",
                       "--temperature", "0", "--out", str(tmp_path / "cli"), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "--first-sample 1 with --temperature 0" in err and "copy" in err, err
        assert not (tmp_path / "cli").exists()
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=2)
    greedy = dict(SETTINGS, temperature=0, samples=1, max_new_tokens=4)
    with pytest.raises(ForesightError, match="first_sample=2 with temperature=0"):  # the library, too
        generate_traces(model, tok, problems, tmp_path / "lib", seed=0, first_sample=2, **greedy)
    assert not (tmp_path / "lib").exists()
    sampled = dict(SETTINGS, samples=1, max_new_tokens=4)  # a later sample at temperature > 0 is fine
    assert load_traces(generate_traces(model, tok, problems, tmp_path / "s1", seed=0, first_sample=1,
                                       **sampled))["trace_id"] == ["synthetic-0#1", "synthetic-1#1"]


def test_traces_rank_sharding_merges_deterministically(tmp_path, monkeypatch):
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=4)
    single = load_traces(generate_traces(model, tok, problems, tmp_path / "one", seed=0, **SETTINGS))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    generate_traces(model, tok, problems, tmp_path / "two", seed=0, **SETTINGS)
    assert trace_progress(tmp_path / "two") == (1, 3)  # rank 1 wrote shard 1 only
    partial = load_traces(tmp_path / "two", complete=False)
    assert set(partial["trace_id"]) < set(single["trace_id"])
    # every reader refuses the unfinished set: a measurement on part of it passed for one on all of it
    with pytest.raises(ForesightError, match=r"two is unfinished: 1 of 3 trace shards done .*rerun the `foresight trace`"):
        load_traces(tmp_path / "two")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert cli_main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(tmp_path / "two"), "--policies",
                     "full", "--budget", "16", "--interval", "4", "--out", str(tmp_path / "ev")]) == 2
    assert not (tmp_path / "ev").exists()
    monkeypatch.setenv("WORLD_SIZE", "2")
    generate_traces(model, tok, problems, tmp_path / "two", seed=0, **SETTINGS)
    merged = load_traces(tmp_path / "two")
    assert merged["trace_id"] == single["trace_id"] and merged["input_ids"] == single["input_ids"]


def test_trace_dir_mismatch_errors(tmp_path):
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=2)
    generate_traces(model, tok, problems, tmp_path, seed=0, **SETTINGS)
    with pytest.raises(ForesightError, match="different settings"):
        generate_traces(model, tok, problems, tmp_path, seed=5, **SETTINGS)
    other, otok = get_model("tiny-qwen3")
    with pytest.raises(ForesightError, match="different fingerprint"):
        generate_traces(other, otok, problems, tmp_path, seed=0, **SETTINGS)
    with pytest.raises(ForesightError, match="no traces"):
        load_traces(tmp_path / "shards")


def test_trace_rerun_with_other_problems_under_the_same_ids_is_refused(tmp_path):
    """Problem sets without ids number their problems 0, 1, ...: a rerun into the same --out with another file (or
    a corrected one) must not keep the finished shards of the old problems as if they were the new ones."""
    model, tok = get_model("tiny-llama")
    for name, texts in (("a", ["What is 1 + 1?", "What is 2 + 2?"]), ("b", ["What is 3 + 3?", "What is 2 + 2?"])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"problem": t, "answer": "2"}) + "\n"
                                                         for t in texts))
    settings = {**SETTINGS, "batch_size": 2}
    generate_traces(model, tok, load_problems(str(tmp_path / "a.jsonl")), tmp_path / "out", seed=0, **settings)
    generate_traces(model, tok, load_problems(str(tmp_path / "a.jsonl")), tmp_path / "out", seed=0, **settings)
    with pytest.raises(ForesightError, match="other problems.*'0#0'"):
        generate_traces(model, tok, load_problems(str(tmp_path / "b.jsonl")), tmp_path / "out", seed=0, **settings)


def test_trace_kill_and_resume(tmp_path):
    """SIGKILL a `foresight trace` subprocess mid-run, plant a half-written shard, rerun: complete, no duplicates."""
    out = tmp_path / "traces"
    cmd = [sys.executable, "-m", "foresight", "trace", "--model", "tiny-llama", "--data", "synthetic", "--limit", "6",
           "--max-new-tokens", "60", "--batch-size", "1", "--seed", "3", "--out", str(out), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    shards = out / "shards"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if shards.exists() and len([p for p in shards.iterdir() if p.name.startswith("traces-")]) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed: " + proc.stdout.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done, total = trace_progress(out)
    assert 2 <= done < total == 6
    # a shard half-written by the killed run (temporaries are renamed into place only when complete)
    half = shards / ".tmp-traces-00005-pid99999"
    half.mkdir()
    (half / "data-00000-of-00001.arrow").write_bytes(b"\x00garbage")
    rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "6 traces" in rerun.stdout
    assert not any(p.name.startswith(".tmp") for p in shards.iterdir())
    ds = load_traces(out)
    assert ds["trace_id"] == [f"synthetic-{i}#0" for i in range(6)]
    # the resumed result equals an uninterrupted run with the same arguments
    model, tok = get_model("tiny-llama")
    ref = generate_traces(
        model, tok, load_problems("synthetic", limit=6), tmp_path / "ref", samples=1, max_new_tokens=60,
        temperature=0.6, top_p=0.95, top_k=20, seed=3, batch_size=1, progress=False,
    )
    assert load_traces(ref)["input_ids"] == ds["input_ids"]


def test_a_rerun_removes_the_temporaries_of_its_own_shards_and_manifests(tmp_path):
    """A kill leaves a shard's temporary (``shards/.tmp-<shard>-pid<pid>``) or its manifest's (``manifests/
    .<shard>.json.tmp-*``, :func:`foresight.atomic.atomic_write_text`): the rank that owns the shard removes both."""
    from golden.sharding import clean_stale

    shards, manifests = tmp_path / "shards", tmp_path / "manifests"
    shards.mkdir()
    manifests.mkdir()
    mine = [shards / ".tmp-traces-00001-pid99", manifests / ".tmp-traces-00001.json-pid99",
            manifests / ".traces-00001.json.tmp-99-0a1b"]
    others = [shards / ".tmp-traces-00002-pid98", manifests / ".traces-00002.json.tmp-98-0a1b",
              manifests / "traces-00001.json"]
    for p in mine + others:
        p.write_text("")
    clean_stale(tmp_path, ["traces-00001"])
    assert [p for p in mine + others if p.exists()] == others


# -- golden labelling pipeline and CLI -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=3)
    out = tmp_path_factory.mktemp("traces")
    settings = {**SETTINGS, "batch_size": 2}
    generate_traces(model, tok, problems, out, seed=0, **settings)
    return out  # 6 traces, prompts ~210-240 tokens + 24 generated


def test_label_traces_skips_short_and_resumes(trace_dir, tmp_path):
    model, _ = get_model("tiny-llama")
    lengths = {r["trace_id"]: len(r["input_ids"]) for r in load_traces(trace_dir)}
    budget, interval = 200, 40  # B+W = 240 sits inside the range of trace lengths
    long_ids = [t for t, n in lengths.items() if n > budget + interval]
    assert 0 < len(long_ids) < len(lengths)
    s = label_traces(model, trace_dir, tmp_path / "g", budget, interval, traces_per_shard=1, progress=False)
    assert (s.planned, s.skipped, s.labelled_now) == (len(long_ids), len(lengths) - len(long_ids), len(long_ids))
    labels = load_labels(tmp_path / "g")
    assert sorted(labels) == sorted(long_ids)
    first = sorted((tmp_path / "g" / "shards").iterdir())[0]
    first.unlink()  # lose one finished shard: the rerun redoes exactly that one
    assert len(load_labels(tmp_path / "g")) == len(long_ids) - 1  # readers of what is finished so far
    # ... in the precision of the others: a bfloat16 resume relabelled it with other evictions, exit 0
    with pytest.raises(ForesightError, match=r"different dtype \(null there, \"bfloat16\" now\)"):
        label_traces(copy.deepcopy(model).to(torch.bfloat16), trace_dir, tmp_path / "g", budget, interval,
                     traces_per_shard=1, progress=False)
    with pytest.raises(ForesightError, match=rf"1 of {len(long_ids)} label shards are not finished"):
        load_labels(tmp_path / "g", complete=True)  # a trainer's read: not the traces labelled so far
    s2 = label_traces(model, trace_dir, tmp_path / "g", budget, interval, traces_per_shard=1, progress=False)
    assert s2.labelled_now == 1 and s2.shards_done == s2.shards_total
    again = load_labels(tmp_path / "g")
    for t, lab in labels.items():
        assert [e.evicted.tolist() for e in lab.events] == [e.evicted.tolist() for e in again[t].events]


def test_a_resume_with_another_limit_names_the_flag(trace_dir, tmp_path, capsys):
    """Another --limit into the same --out is told by the number of traces and the flags that choose them, not as
    `a different units (N there, M now)` (shards, no flag named)."""
    model, tok = get_model("tiny-llama")
    before = sorted(p.name for p in (trace_dir / "shards").iterdir())
    with pytest.raises(ForesightError, match=r"different number of traces \(6 there, 4 now; set by --data, --limit"):
        generate_traces(model, tok, load_problems("synthetic", limit=2), trace_dir, seed=0,
                        **{**SETTINGS, "batch_size": 2})
    assert sorted(p.name for p in (trace_dir / "shards").iterdir()) == before
    base = ["golden", "--model", "tiny-llama", "--traces", str(trace_dir), "--out", str(tmp_path / "g"),
            "--budget", "16", "--interval", "4", "--no-progress"]
    assert cli_main([*base, "--limit", "1"]) == 0
    capsys.readouterr()
    assert cli_main([*base, "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "different number of traces (1 there, 2 now; set by --traces, --limit" in err, err
    assert cli_main([*base, "--limit", "1", "--traces-per-shard", "1"]) == 0  # one trace: the same single shard


def test_golden_refuses_traces_too_short_to_label(trace_dir, tmp_path, capsys):
    """Every trace at most B+W tokens: an --out without a label was written with exit 0, which readers then called
    "no finished label shards yet"; now one line, exit 2, nothing written."""
    out = tmp_path / "g"
    assert cli_main(["golden", "--model", "tiny-llama", "--traces", str(trace_dir), "--out", str(out), "--budget",
                     "1024", "--interval", "16", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "all 6 trace(s) have at most B+W=1040 tokens" in err, err
    assert not out.exists()


def test_golden_cli_errors(trace_dir, tmp_path, capsys):
    out = str(tmp_path / "g")
    base = ["golden", "--model", "tiny-llama", "--traces", str(trace_dir), "--out", out, "--no-progress"]
    assert cli_main([*base, "--budget", "200", "--interval", "40"]) == 0
    printed = capsys.readouterr().out
    assert "skipped" in printed and "of at most B+W=240 tokens" in printed
    assert cli_main([*base, "--budget", "200", "--interval", "32"]) == 2
    assert "different interval (40 there, 32 now)" in capsys.readouterr().err
    assert cli_main([*base, "--budget", "100", "--interval", "40"]) == 2
    assert "different budget" in capsys.readouterr().err
    # the oracle's measure is part of what a directory holds: a resume with another is refused, naming both
    assert cli_main([*base, "--budget", "200", "--interval", "40", "--measure", "output"]) == 2
    assert 'different measure (null there, "output" now)' in capsys.readouterr().err
    assert cli_main([*base, "--budget", "200", "--interval", "40", "--measure", "values"]) == 2
    assert "invalid choice: 'values'" in capsys.readouterr().err
    other_out = ["--out", str(tmp_path / "o"), "--budget", "200", "--interval", "40", "--measure", "output"]
    assert cli_main([*base, *other_out]) == 0  # the later --out wins
    assert json.loads((tmp_path / "o" / "plan.json").read_text())["measure"] == "output"
    assert "measure" not in json.loads((tmp_path / "g" / "plan.json").read_text())  # the method's: as before
    capsys.readouterr()
    other = ["golden", "--model", "tiny-qwen3", "--traces", str(trace_dir), "--out", str(tmp_path / "q"), "--no-progress"]
    assert cli_main([*other, "--budget", "64", "--interval", "16"]) == 2
    err = capsys.readouterr().err
    assert "made with another model ('tiny-llama'" in err and "model_type: 'llama' vs 'qwen3'" in err
    assert cli_main([*base, "--budget", "16", "--interval", "16"]) == 2
    assert "interval (16) must be smaller than budget" in capsys.readouterr().err
    assert cli_main(["golden", "--model", "tiny-llama", "--traces", str(tmp_path / "none"), "--out", out,
                     "--budget", "64", "--interval", "16"]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_damaged_or_foreign_saved_dataset_is_one_line(tmp_path):
    """A saved dataset with a junk state.json, or without the trace columns, was a FileNotFoundError / KeyError
    traceback in the scripts (and a message naming no directory in the CLI)."""
    import datasets

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "state.json").write_text("{}")
    with pytest.raises(ForesightError, match=f"{junk}: not a readable saved dataset"):
        load_traces(junk)
    other = tmp_path / "other"
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(other))
    with pytest.raises(ForesightError, match=f"{other}: a saved dataset without the trace column.s. trace_id, "
                                             "input_ids"):
        load_traces(other)


def test_a_trace_set_resumes_only_in_its_own_precision(tmp_path):
    """A trace set started with bfloat16 weights and resumed with float32 ones sampled its later shards from other
    logits (exit 0); the plan records a dtype other than float32, and a resume in another one is refused."""
    model, tok = get_model("tiny-llama")
    problems = load_problems("synthetic", limit=2)
    half = copy.deepcopy(model).to(torch.bfloat16)
    generate_traces(half, tok, problems, tmp_path / "t", seed=0, **SETTINGS)
    assert json.loads((tmp_path / "t" / "plan.json").read_text())["dtype"] == "bfloat16"
    with pytest.raises(ForesightError, match=r'different dtype \("bfloat16" there, null now\)'):
        generate_traces(model, tok, problems, tmp_path / "t", seed=0, **SETTINGS)
    generate_traces(model, tok, problems, tmp_path / "f", seed=0, **SETTINGS)  # float32: no key, as before
    assert "dtype" not in json.loads((tmp_path / "f" / "plan.json").read_text())
