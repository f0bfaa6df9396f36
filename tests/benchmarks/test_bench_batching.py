"""benchmarks/bench_batching.py: SL feature extraction and a DAgger round, batched in trace order and by length."""

from __future__ import annotations

import json

import foresight
from tests.conftest import load_script
from tests.training.test_sl import B, W, _make_data


def test_both_batchings_record_the_same_features_on_a_tiny_model(tmp_path, capsys):
    from foresight.scorer import Scorer, ScorerConfig

    traces, labels = _make_data(tmp_path, n=5, base_len=40)
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    Scorer(ScorerConfig(foresight.model_fingerprint(model), B, W, feature_set=("key", "value", "attn"))
           ).save_pretrained(tmp_path / "scorer")
    assert load_script("bench_batching.py").main(
        ["--model", "tiny-llama", "--traces", str(traces), "--labels", str(labels), "--scorer", str(tmp_path / "scorer"),
         "--budget", str(B), "--interval", str(W), "--batch-size", "2", "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0]: line.split(" | ") for line in out.splitlines() if line.startswith("| SL")
            or line.startswith("| DAgger")}
    assert set(rows) == {"| SL features", "| DAgger round 1"}
    assert float(rows["| SL features"][4]) < 1e-3 and rows["| SL features"][5].startswith("5 / 5")
    rec = json.loads((tmp_path / "out.json").read_text())
    assert rec["traces"] == 5 and rec["padded_tokens"]["by length"] <= rec["padded_tokens"]["trace order"]
