"""benchmarks/bench_replay.py: evicting replay, layer-major and piecewise, against the one-piece full replay."""

from __future__ import annotations

import json

import pytest

from foresight.errors import ForesightError
from tests.conftest import get_model, load_script


def test_both_engines_agree_on_a_tiny_model(tmp_path, capsys):
    model, tok = get_model("tiny-llama")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "bench.json"
    assert load_script("bench_replay.py").main(
        ["--model", str(tmp_path / "model"), "--length", "60", "--limit", "2", "--policies", "h2o,tova", "--budget",
         "16", "--interval", "4", "--repeats", "1", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert (got["sequences"], got["tokens"], got["budget"], got["interval"], got["length"]) == (2, 120, 16, 4, 60)
    assert set(got["seconds"]) == {"full (one piece)", "h2o layer-major", "h2o piecewise", "tova layer-major",
                                   "tova piecewise"}
    assert got["ratio_to_full"]["full (one piece)"] == 1.0
    for name in ("h2o", "tova"):
        agree = got["agreement"][name]
        assert agree["max_ce_difference"] < 1e-4 and agree["same_stats"]
        assert agree["engines"] == ["layer-major", "piecewise"]
    printed = capsys.readouterr().out
    assert "h2o layer-major" in printed and "cache statistics identical" in printed


def test_bad_policies_fail_before_the_model_loads(tmp_path):
    mod = load_script("bench_replay.py")
    with pytest.raises(ForesightError, match="--policies full: it never evicts"):
        mod.main(["--model", str(tmp_path / "no-model"), "--policies", "full"])
    with pytest.raises(ForesightError, match="--policies paged"):
        mod.main(["--model", str(tmp_path / "no-model"), "--policies", "paged", "--interval", "6", "--budget", "16"])


def test_missing_traces_fail_before_the_model_loads(tmp_path):
    with pytest.raises(ForesightError, match="trace directory not found"):
        load_script("bench_replay.py").main(["--model", str(tmp_path / "no-model"), "--traces", str(tmp_path / "x")])


def test_length_cuts_the_traces_and_is_recorded(tmp_path, capsys):
    """--traces with --length N replayed the traces whole (--length only sized random tokens), while the command
    line read as N-token sequences: now each trace's first N tokens, recorded as ``length`` in the JSON (null for
    whole traces); a trace shorter than N is refused before the model loads."""
    from foresight.data import load_problems
    from golden.traces import generate_traces, load_traces

    model, tok = get_model("tiny-llama")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    traces = generate_traces(model, tok, load_problems("synthetic", limit=2), tmp_path / "traces", samples=1,
                             max_new_tokens=6, temperature=0.8, batch_size=2, progress=False)
    lengths = sorted((r["trace_id"], len(r["input_ids"])) for r in load_traces(traces))
    shortest = min(n for _, n in lengths)
    assert shortest > 20
    mod = load_script("bench_replay.py")
    base = ["--model", str(tmp_path / "model"), "--traces", str(traces), "--budget", "16", "--interval", "4",
            "--policies", "h2o", "--repeats", "1"]
    out = tmp_path / "cut.json"
    assert mod.main([*base, "--length", "20", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert (got["sequences"], got["length"], got["tokens"], got["traces"]) == (2, 20, 40, str(traces))
    assert "(20 tokens each)" in capsys.readouterr().out
    assert got["agreement"]["h2o"]["max_ce_difference"] < 1e-4
    whole = tmp_path / "whole.json"
    assert mod.main([*base, "--json", str(whole)]) == 0
    got = json.loads(whole.read_text())
    assert got["length"] is None and got["tokens"] == sum(n for _, n in lengths)
    too_long = max(n for _, n in lengths) + 1
    (tid, n), = lengths[:1]
    with pytest.raises(ForesightError, match=rf"--length {too_long}: trace '{tid}' of --traces {traces} has only "
                                             rf"{n} tokens \(2 of the 2 traces are shorter\); pass --length "
                                             rf"{shortest} or less"):
        mod.main(["--model", str(tmp_path / "no-model"), *base[2:], "--length", str(too_long)])


def test_compiled_events_are_timed_beside_the_eager_ones(tmp_path, capsys):
    import foresight
    from foresight.scorer import Scorer, ScorerConfig

    model, tok = get_model("tiny-llama")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=16, interval=4, hidden=8,
                       feature_set=("prekey", "value", "attn", "age"))
    Scorer(cfg, seed=0).save_pretrained(tmp_path / "scorer")
    out = tmp_path / "bench.json"
    assert load_script("bench_replay.py").main(
        ["--model", str(tmp_path / "model"), "--length", "60", "--limit", "1", "--policies", "h2o,learned",
         "--scorer", str(tmp_path / "scorer"), "--budget", "16", "--interval", "4", "--repeats", "1",
         "--compiled", "aot_eager", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert {"learned compiled layer-major", "learned compiled piecewise"} <= set(got["seconds"])
    assert "h2o compiled layer-major" not in got["seconds"]  # h2o has nothing to compile
    assert set(got["warmup_seconds"]) == {"learned compiled layer-major", "learned compiled piecewise"}
    same = got["compiled_vs_eager"]["learned compiled"]
    assert same["same_stats"] and same["max_ce_difference"] == 0.0
    assert "learned compiled vs eager events" in capsys.readouterr().out
