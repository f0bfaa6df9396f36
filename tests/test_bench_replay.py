"""benchmarks/bench_replay.py: the full-cache replay in W-token pieces against FULL_PIECE pieces."""

from __future__ import annotations

import json

import pytest

from foresight.errors import ForesightError
from tests.conftest import get_model, load_script


def test_both_sides_agree_on_a_tiny_model(tmp_path):
    model, tok = get_model("tiny-llama")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "bench.json"
    assert load_script("bench_replay.py").main(
        ["--model", str(tmp_path / "model"), "--length", "40", "--limit", "2", "--interval", "8", "--repeats", "1",
         "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert (got["sequences"], got["tokens"], got["interval"], got["length"]) == (2, 80, 8, 40)
    assert got["max_ce_difference"] < 1e-4 and got["ratio"] > 0


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
    base = ["--model", str(tmp_path / "model"), "--traces", str(traces), "--interval", "8", "--repeats", "1"]
    out = tmp_path / "cut.json"
    assert mod.main([*base, "--length", "20", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert (got["sequences"], got["length"], got["tokens"], got["traces"]) == (2, 20, 40, str(traces))
    assert "(20 tokens each)" in capsys.readouterr().out
    assert got["max_ce_difference"] < 1e-4
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
