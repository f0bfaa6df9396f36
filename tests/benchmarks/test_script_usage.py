"""Every stand-alone script under ``benchmarks/`` keeps the command line's contract for usage errors: one line
``<prog>: error: ...`` on stderr, exit status 2 (``foresight.errors.OneLineParser``), not argparse's usage block."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.rglob("*.py")
                 if "ArgumentParser" in p.read_text() or "OneLineParser" in p.read_text())


def test_scripts_found():
    assert len(SCRIPTS) >= 20 and "quality/run.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_usage_error_is_one_line(script, monkeypatch, capsys):
    source = (BENCHMARKS / script).read_text()
    assert "argparse.ArgumentParser(" not in source, f"{script}: use foresight.errors.OneLineParser"
    monkeypatch.setattr(sys, "argv", [script, "--no-such-flag"])
    monkeypatch.syspath_prepend(str((BENCHMARKS / script).parent))  # scripts that import their siblings
    mod = load_script(script, f"usage_{Path(script).stem}")
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": error: " in err and "usage:" not in err, err


def test_split_refuses_a_file_as_its_output_dir(tmp_path):
    from foresight.errors import ForesightError

    target = tmp_path / "split"
    target.write_text("not a directory")
    with pytest.raises(ForesightError, match="exists and is not a directory"):
        load_script("quality/split.py", "usage_split").main([str(target)])
    with pytest.raises(ForesightError, match=f"{target} is not a directory"):  # under the file: a traceback
        load_script("quality/split.py", "usage_split").main([str(target / "sub")])
    assert target.read_text() == "not a directory"


def test_bench_features_refuses_a_zero_count_and_a_missing_compare_file(tmp_path, monkeypatch, capsys):
    """--steps 0 was a ZeroDivisionError after the run; --compare naming a missing or non-Python file was a
    traceback from importlib."""
    from foresight.errors import ForesightError

    mod = load_script("bench_features.py", "usage_bench_features_values")
    monkeypatch.setattr(sys, "argv", ["bench_features.py", "--steps", "0"])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--steps" in err, err
    (tmp_path / "f.json").write_text("{}")
    for other in (tmp_path / "missing.py", tmp_path / "f.json"):
        monkeypatch.setattr(sys, "argv", ["bench_features.py", "--steps", "1", "--repeats", "1",
                                          "--compare", str(other)])
        with pytest.raises(ForesightError, match="not a Python file"):
            mod.main()


@pytest.mark.parametrize("flag", ["--files", "--batches", "--micro-batch"])
def test_bench_packed_events_refuses_a_count_below_one(flag, tmp_path, monkeypatch, capsys):
    """--batches 0 divided by the zero batches read after the whole conversion (ZeroDivisionError), a negative
    --micro-batch failed in torch.randint: refused up front."""
    mod = load_script("bench_packed_events.py", "usage_bench_packed_events_values")
    monkeypatch.setattr(sys, "argv", ["bench_packed_events.py", str(tmp_path), flag, "0"])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and f"argument {flag}: must be a positive integer" in err, err


def test_bench_shape_refuses_a_bad_device_policy_or_out_before_building_the_model(tmp_path):
    """--device nonsense was a RuntimeError traceback; paged at a W that is not a multiple of its block failed after
    the model was built, and an --out that is a file after the whole benchmark."""
    from foresight.errors import ForesightError

    mod = load_script("bench_shape.py", "usage_bench_shape_values")
    (tmp_path / "f").write_text("a file")
    base = ["--shape", "smollm2-135m", "--budget", "64", "--interval", "8", "--policies", "h2o"]
    for extra, match in ((["--device", "nonsense"], "--device: unknown device 'nonsense'"),
                         (["--device", "cpu", "--policies", "h2o,paged"], "--policies 'paged': paged: block_size"),
                         (["--device", "cpu", "--out", str(tmp_path / "f")], "exists and is not a directory")):
        with pytest.raises(ForesightError, match=match):
            mod.main([*base, *extra])
    assert (tmp_path / "f").read_text() == "a file"


def test_bench_runtime_refuses_what_would_fail_or_never_evict_after_the_model_load(tmp_path, monkeypatch, capsys):
    """--repeats 0 (a StatisticsError), an unknown policy, W >= B, paged at a W its blocks do not divide and a
    directory --json were tracebacks after the model load; --policy h2o without --budget ran with an unbounded cache
    (nothing evicted) and reported it as h2o."""
    from foresight.errors import ForesightError

    mod = load_script("bench_runtime.py", "usage_bench_runtime_values")
    base = ["bench_runtime.py", "--model", "no-such-model"]
    monkeypatch.setattr(sys, "argv", [*base, "--repeats", "0"])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2 and "--repeats: must be a positive integer" in capsys.readouterr().err
    for extra, match in ((["--policy", "nope", "--budget", "16"], "--policy nope: unknown policy"),
                         (["--policy", "h2o"], "needs --budget"),
                         (["--interval", "4"], "--interval: needs --budget"),
                         (["--policy", "h2o", "--budget", "16", "--interval", "16"], "must be smaller than budget"),
                         (["--policy", "paged", "--budget", "64", "--interval", "8"], "paged: block_size"),
                         (["--policy", "h2o", "--budget", "16", "--json", str(tmp_path)], "is a directory"),
                         # full ignored the budget
                         (["--policy", "full", "--budget", "16"], "--budget 16: policy 'full' never evicts")):
        monkeypatch.setattr(sys, "argv", [*base, *extra])
        with pytest.raises(ForesightError, match=match):
            mod.main()
    # the results named the policy but not the B, W it ran at
    monkeypatch.setattr(sys, "argv", ["bench_runtime.py", "--model", "tiny-llama", "--policy", "h2o", "--budget", "16",
                                      "--new-tokens", "4", "--repeats", "1", "--json", str(tmp_path / "r.json")])
    mod.main()
    got = json.loads((tmp_path / "r.json").read_text())
    assert (got["policy"], got["budget"], got["interval"]) == ("h2o", 16, 4)
    assert "policy h2o, B=16 W=4" in capsys.readouterr().out


def test_bench_golden_and_bench_replay_refuse_bad_settings_before_the_model_load(tmp_path, monkeypatch):
    """bench_golden timed W >= B without a word (exit 0), --tokens 0 was an AttributeError and --device nonsense a
    RuntimeError; bench_replay's --json naming a directory was an IsADirectoryError after the whole benchmark."""
    from foresight.errors import ForesightError

    golden = load_script("bench_golden.py", "usage_bench_golden_values")
    for extra, match in ((["--budget", "16", "--interval", "16"], "must be smaller than budget"),
                         (["--tokens", "20", "--budget", "16", "--interval", "4"], "--tokens 20: must exceed B \\+ W"),
                         (["--device", "nonsense"], "--device: unknown device")):
        monkeypatch.setattr(sys, "argv", ["bench_golden.py", "--model", "no-such-model", *extra])
        with pytest.raises(ForesightError, match=match):
            golden.main()
    monkeypatch.setattr(sys, "argv", ["bench_golden.py", "--tokens", "0"])
    with pytest.raises(SystemExit) as exc:
        golden.main()
    assert exc.value.code == 2
    replay = load_script("bench_replay.py", "usage_bench_replay_values")
    with pytest.raises(ForesightError, match="is a directory"):
        replay.main(["--model", "no-such-model", "--json", str(tmp_path)])


def test_adapt_eval_refuses_a_bad_cache_setting_or_out_before_reading_the_adapter(tmp_path):
    """W >= B, sinks past B - W and paged at a W its blocks do not divide failed in the first replay, after the model
    load; an --out that is a file after the whole evaluation."""
    from foresight.errors import ForesightError

    mod = load_script("adapt_eval.py", "usage_adapt_eval_values")
    (tmp_path / "f").write_text("a file")
    base = ["--adapter", str(tmp_path / "none"), "--traces", str(tmp_path / "none"), "--out", str(tmp_path / "o")]
    for extra, match in ((["--policies", "h2o", "--budget", "16", "--interval", "16"], "must be smaller than budget"),
                         (["--policies", "h2o", "--budget", "16", "--interval", "4", "--sinks", "13"], "sinks must be"),
                         (["--policies", "paged", "--budget", "64", "--interval", "8"], "paged: block_size"),
                         (["--policies", "h2o", "--budget", "16", "--interval", "4", "--out", str(tmp_path / "f")],
                          "exists and is not a directory")):
        with pytest.raises(ForesightError, match=match):
            mod.main([*base, *extra])


def test_an_output_dir_under_a_file_is_refused_before_the_work(tmp_path):
    """``--out FILE/sub``: check_output_dir accepted it (only ``FILE`` itself was refused), so adapt_eval.py ended
    its whole evaluation in a NotADirectoryError and average_scorers.py in a traceback."""
    from foresight.errors import ForesightError
    from foresight.output_paths import check_output_dir

    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad in (afile, afile / "sub", afile / "sub" / "deeper"):
        with pytest.raises(ForesightError, match=f"--out {bad}: .*not a directory"):
            check_output_dir(bad, "--out")
    assert check_output_dir(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    mod = load_script("average_scorers.py", "usage_average_scorers_out")
    with pytest.raises(ForesightError, match=f"--out {afile / 'sub'}: {afile} is not a directory"):
        mod.main(["missing-a", "missing-b", "--out", str(afile / "sub")])  # refused before the members are read


def test_average_scorers_refuses_members_of_different_temperatures_unless_one_is_chosen(tmp_path, monkeypatch, capsys):
    """Members recording different sampling temperatures (0.5 and 2, or 0.5 beside none) were averaged into a
    scorer that sampled at the first recorded one, a temperature nobody chose for the ensemble: refused in one line
    naming each member's temperature (exit 2), unless --temperature chooses it; equal ones are kept."""
    from foresight.scorer import Scorer, ScorerConfig

    fp = {"model": "fake", "num_layers": 2, "num_kv_heads": 1, "num_heads": 2, "head_dim": 8}
    dirs = {}
    for name, temp in (("hot", 0.5), ("cold", 2.0), ("plain", None), ("hot2", 0.5)):
        Scorer(ScorerConfig(fp, budget=16, interval=4, hidden=4, temperature=temp), seed=0).save_pretrained(
            tmp_path / name)
        dirs[name] = str(tmp_path / name)
    mod = load_script("average_scorers.py", "usage_average_scorers_temperature")
    for a, b, want in (("hot", "cold", "0.5.*2"), ("hot", "plain", "0.5.*none"), ("plain", "hot", "none.*0.5")):
        monkeypatch.setattr(sys, "argv", ["average_scorers.py", dirs[a], dirs[b], "--out", str(tmp_path / "avg")])
        with pytest.raises(SystemExit) as exc:
            mod.run_script(mod.main, "average_scorers")
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1, err
        assert f"{dirs[a]}: " in err and f"{dirs[b]}: " in err and "--temperature" in err, err
        assert re.search(f"different temperatures \\(.*{want}", err), err
        assert not (tmp_path / "avg").exists()
    assert mod.main([dirs["hot"], dirs["cold"], "--out", str(tmp_path / "chosen"), "--temperature", "0.8"]) == 0
    cfg = json.loads((tmp_path / "chosen" / "config.json").read_text())
    assert cfg["temperature"] == 0.8 and cfg["provenance"]["temperature_chosen"] == "--temperature"
    assert [m["temperature"] for m in cfg["provenance"]["average_of"]] == [0.5, 2.0]
    assert mod.main([dirs["hot"], dirs["hot2"], "--out", str(tmp_path / "same")]) == 0
    assert json.loads((tmp_path / "same" / "config.json").read_text())["temperature"] == 0.5
    assert mod.main([dirs["plain"], dirs["plain"], "--out", str(tmp_path / "none")]) == 0
    assert json.loads((tmp_path / "none" / "config.json").read_text())["temperature"] is None
    for bad in ("0", "-1", "nan"):
        with pytest.raises(SystemExit) as exc:
            mod.main([dirs["hot"], dirs["cold"], "--out", str(tmp_path / "bad"), "--temperature", bad])
        assert exc.value.code == 2


def test_every_device_option_of_a_script_is_checked_when_parsed():
    """bench_policies.py --device bogus was a RuntimeError traceback once the model loaded: a script's --device is
    parsed with foresight.config.device_arg or checked with check_device before use."""
    for script in SCRIPTS:
        source = (BENCHMARKS / script).read_text()
        if '"--device"' in source:
            assert "device_arg" in source or "check_device(args.device" in source, script
