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
    assert (got["sequences"], got["tokens"], got["interval"]) == (2, 80, 8)
    assert got["max_ce_difference"] < 1e-4 and got["ratio"] > 0


def test_missing_traces_fail_before_the_model_loads(tmp_path):
    with pytest.raises(ForesightError, match="trace directory not found"):
        load_script("bench_replay.py").main(["--model", str(tmp_path / "no-model"), "--traces", str(tmp_path / "x")])
