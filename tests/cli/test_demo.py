"""The end-to-end demo (`foresight demo --fast`) produces every artifact, through the real pipeline."""

from __future__ import annotations

import json
import math

import pytest

from foresight.cli import main
from training.demo import DEMO_POLICIES, DemoConfig, grpo_verdict


def _check_outputs(out):
    records = json.loads((out / "fidelity" / "fidelity.json").read_text())
    got = {(r["policy"], r["budget"]) for r in records}
    cfg = json.loads((out / "demo_config.json").read_text())
    for b in cfg["budgets"]:
        for p in DEMO_POLICIES:
            assert (p, b) in got, (p, b)
    full = [r for r in records if r["policy"] == "full"]
    assert all(abs(r["loss_ratio"] - 1.0) < 1e-4 and r["kl"] < 1e-5 for r in full)
    assert (out / "fidelity" / "fidelity.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "## Verdict" in report and "learned loss ratio" in report
    assert (out / "scorer_export" / "model.safetensors").exists()
    card = (out / "scorer_export" / "README.md").read_text()
    assert "| learned |" in card and "SL only" not in card  # the exported scorer's rows, not the SL scorer's
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_traces"] >= 1 and summary["export"]["onnx_max_abs_diff"] <= 1e-5
    grpo = summary["grpo"]
    for when in ("eval_before", "eval_after"):  # GRPO's own held-out evaluation, before and after training
        assert math.isfinite(grpo[when]["heldout_loss_ratio_topk"]) and grpo[when]["heldout_reward_sample"] <= 0
    assert "GRPO (" in report and "top-k loss ratio" in report
    from foresight.scorer import Scorer

    Scorer.from_pretrained(out / "scorer_export")


def test_demo_fast_on_tiny_model(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--fast", "--model", "tiny-llama", "--out", str(out)]) == 0
    _check_outputs(out)
    # a rerun into the same directory trains afresh instead of meeting the first run's checkpoints
    assert main(["demo", "--fast", "--model", "tiny-llama", "--out", str(out)]) == 0
    _check_outputs(out)


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_demo_fast_on_default_model(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--fast", "--out", str(out)]) == 0
    _check_outputs(out)


def test_demo_refuses_a_bad_model_or_out_before_writing(tmp_path, capsys):
    """--model with a typo wrote <out>/demo_config.json before the model load failed."""
    assert main(["demo", "--fast", "--model", "no-such-model", "--out", str(tmp_path / "demo")]) == 2
    assert "Unknown model 'no-such-model'" in capsys.readouterr().err and not (tmp_path / "demo").exists()
    (tmp_path / "f").write_text("a file")
    assert main(["demo", "--fast", "--model", "no-such-model", "--out", str(tmp_path / "f" / "demo")]) == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "f").read_text() == "a file"


def test_demo_config_validation():
    with pytest.raises(ValueError, match="must be one of"):
        DemoConfig(budget=96)
    with pytest.raises(ValueError, match="exceed the interval"):
        DemoConfig(budgets=[16, 128], interval=32)


def test_grpo_verdict_reports_before_and_after_honestly():
    before = {"heldout_reward_sample": -0.5, "heldout_reward_topk": -0.2, "heldout_loss_ratio_topk": 1.30}
    better = {"heldout_reward_sample": -0.4, "heldout_reward_topk": -0.2, "heldout_loss_ratio_topk": 1.29}
    worse_ratio = {**better, "heldout_loss_ratio_topk": 1.31}
    line = grpo_verdict({"steps": 3, "eval_before": before, "eval_after": better})
    assert "-0.50000 -> -0.40000" in line and "1.3000 -> 1.2900" in line and "(improved" in line
    assert "no clear improvement" in grpo_verdict({"eval_before": before, "eval_after": worse_ratio})
    assert grpo_verdict({"eval_before": before}) is None
