"""benchmarks/bench_logits.py: golden labelling and SL features with and without every position's logits."""

from __future__ import annotations

from tests.conftest import get_model, load_script


def test_both_jobs_give_identical_outputs_on_a_tiny_model(tmp_path, capsys):
    model, tok = get_model("tiny-llama")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    assert load_script("bench_logits.py").main(
        ["--model", str(tmp_path / "model"), "--length", "60", "--limit", "2", "--budget", "16", "--interval", "4",
         "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| golden") or
            line.startswith("| SL")]
    assert len(rows) == 2 and all(r.endswith("| True |") for r in rows)
