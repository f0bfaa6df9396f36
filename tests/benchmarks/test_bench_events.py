"""benchmarks/bench_events.py: a decode eviction event of ``learned``, all layers at once against layer by layer."""

from __future__ import annotations

import json

import pytest

import foresight
from foresight.errors import ForesightError
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model, load_script


def test_both_sides_time_the_same_events_and_tokens(tmp_path, capsys):
    model, tok = get_model("tiny-llama")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=16, interval=4, feature_set=("key", "value", "attn"))
    Scorer(cfg, seed=0).save_pretrained(tmp_path / "scorer")
    out = tmp_path / "events.json"
    assert load_script("bench_events.py").main(
        ["--model", str(tmp_path / "model"), "--scorer", str(tmp_path / "scorer"), "--budget", "16", "--interval", "4",
         "--new-tokens", "30", "--repeats", "1", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["events"] > 2 and set(got["ms_per_event"]) == {"layer by layer", "all layers at once"}
    assert got["speedup"] == pytest.approx(got["ms_per_event"]["layer by layer"]
                                           / got["ms_per_event"]["all layers at once"])
    assert "same tokens" in capsys.readouterr().out


def test_a_scorer_of_another_setting_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(ForesightError, match="is for B=64 W=16, not B=32 W=8"):
        load_script("bench_events.py").main(["--model", str(tmp_path / "no-model"), "--budget", "32",
                                             "--interval", "8"])
