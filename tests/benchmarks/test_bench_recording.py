"""The recording benchmarks on a tiny model: benchmarks/bench_batching.py (SL feature extraction and a DAgger round,
batched in trace order and by length) and benchmarks/bench_rows.py (rows of every feature group and of the scorer's
groups only, of a DAgger round and of the feature cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import foresight
from tests.conftest import load_script
from tests.training.test_sl import B, W, _make_data

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path, monkeypatch, feature_set: tuple[str, ...], *extra: str) -> dict:
    """Run ``script`` on five tiny traces with a fresh scorer of ``feature_set``; its JSON record."""
    from foresight.scorer import Scorer, ScorerConfig

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # the scripts import their helper beside them

    traces, labels = _make_data(tmp_path, n=5, base_len=40)
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    Scorer(ScorerConfig(foresight.model_fingerprint(model), B, W, feature_set=feature_set)
           ).save_pretrained(tmp_path / "scorer")
    assert load_script(script).main(
        ["--model", "tiny-llama", "--traces", str(traces), "--labels", str(labels), "--scorer",
         str(tmp_path / "scorer"), "--budget", str(B), "--interval", str(W), "--batch-size", "2", "--json",
         str(tmp_path / "out.json"), *extra]) == 0
    return json.loads((tmp_path / "out.json").read_text())


def test_both_batchings_record_the_same_features_on_a_tiny_model(tmp_path, capsys, monkeypatch):
    rec = _run("bench_batching.py", tmp_path, monkeypatch, ("key", "value", "attn"))
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0]: line.split(" | ") for line in out.splitlines() if line.startswith("| SL")
            or line.startswith("| DAgger")}
    assert set(rows) == {"| SL features", "| DAgger round 1"}
    assert float(rows["| SL features"][4]) < 1e-3 and rows["| SL features"][5].startswith("5 / 5")
    assert rec["traces"] == 5 and rec["padded_tokens"]["by length"] <= rec["padded_tokens"]["trace order"]


@pytest.mark.parametrize("trajectory", ["round", "golden"])
def test_rows_of_the_scorers_groups_hold_its_columns_and_are_smaller(tmp_path, capsys, monkeypatch, trajectory):
    rec = _run("bench_rows.py", tmp_path, monkeypatch, ("attn", "value", "age"), "--trajectory", trajectory)
    out = capsys.readouterr().out
    assert rec["trajectory"] == trajectory and out.startswith("the golden" if trajectory == "golden" else "DAgger")
    assert "| scorer's groups | value,attn,age |" in out and "bit-identical: True; same caches on 5 / 5" in out
    assert rec["groups"]["scorer's groups"] == ["value", "attn", "age"] and rec["same_caches"] == 5
    assert 0 < rec["rows_bytes"]["scorer's groups"] < rec["rows_bytes"]["every group"]


def test_labels_of_another_budget_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    from golden.labels import LabelMismatchError

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    traces, labels = _make_data(tmp_path, n=2, base_len=40)

    def no_model(*a, **k):
        raise AssertionError("the model must not load before the labels' B/W are checked")

    monkeypatch.setattr(foresight, "load_model", no_model)
    for script in ("bench_rows.py", "bench_batching.py"):
        with pytest.raises(LabelMismatchError, match=rf"made for B={B}, W={W}, not B={2 * B}, W={W}"):
            load_script(script).main(["--model", "tiny-llama", "--traces", str(traces), "--labels", str(labels),
                                      "--budget", str(2 * B), "--interval", str(W)])
