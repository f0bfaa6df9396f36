"""benchmarks/grpo_smollm2/*.py keep the scripts' contract: a bad input is one line naming it, exit status 2, found
before the model loads (they read $E and sys.argv unchecked: a missing path or a bad number was a traceback, and
summarise.py paired scorers over whatever traces the first one had)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from foresight.errors import ForesightError
from foresight.models import model_fingerprint
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import load_script, save_random_traces


def _script(name: str):
    return load_script(f"grpo_smollm2/{name}.py", f"grpo_smollm2_{name}")


def _scorer(path: Path, model, budget: int, interval: int) -> str:
    Scorer(ScorerConfig(model_fingerprint(model), budget=budget, interval=interval, hidden=4), seed=0) \
        .save_pretrained(path)
    return str(path)


def _no_model(mod, monkeypatch, name: str) -> None:
    monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("the model loaded before the inputs were checked"))


def test_compare_refuses_scorers_of_two_settings(tmp_path, tiny_llama, monkeypatch):
    model, _ = tiny_llama
    a, b = _scorer(tmp_path / "a", model, 64, 16), _scorer(tmp_path / "b", model, 128, 32)
    mod = _script("compare")
    _no_model(mod, monkeypatch, "GRPOTask")
    with pytest.raises(ForesightError, match="scorer grpo .* trained at B=128 W=32, sl at B=64 W=16"):
        mod.main(["sl,grpo", f"{a},{b}", "--exp", str(tmp_path)])
    with pytest.raises(ForesightError, match="2 names .* but 1 directories"):
        mod.main(["sl,grpo", a, "--exp", str(tmp_path)])
    assert not (tmp_path / "compare.json").exists()


@pytest.mark.parametrize("value", ["0", "nan", "hot"])
def test_probe_refuses_a_bad_temperature(tmp_path, monkeypatch, capsys, value):
    mod = _script("probe")
    _no_model(mod, monkeypatch, "GRPOTask")
    with pytest.raises(SystemExit) as exc:
        mod.main(["0.003", value, "--exp", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and f"'{value}'" in err, err


def test_sample_vs_topk_refuses_a_split_of_other_traces(tmp_path, tiny_llama, monkeypatch):
    """A held-out trace missing from the traces evaluated fewer traces than the split names, without a word."""
    model, _ = tiny_llama
    save_random_traces(model, tmp_path / "traces", [90, 95])
    (tmp_path / "sl").mkdir()
    (tmp_path / "sl" / "split.json").write_text(json.dumps({"train": ["p0#0"], "heldout": ["p1#0", "q7#0"]}))
    mod = _script("sample_vs_topk")
    _no_model(mod, monkeypatch, "load_model")
    sc = _scorer(tmp_path / "sc", model, 64, 16)
    with pytest.raises(ForesightError, match=r"1 held-out trace\(s\) are not in .*traces \(e.g. 'q7#0'\)"):
        mod.main(["sl", sc, "--exp", str(tmp_path)])
    with pytest.raises(ForesightError, match="is for B=64 W=16, not B=32 W=8"):  # before the model, too
        mod.main(["sl", sc, "--exp", str(tmp_path), "--budget", "32", "--interval", "8"])
    assert not (tmp_path / "sample_vs_topk.json").exists()


def test_summarise_refuses_scorers_run_on_other_traces(tmp_path):
    row = {"r_topk": -0.1, "ce_topk": 1.2, "ce_full": 1.0, "r_sample_12345": -0.1, "lr_sample_12345": 1.1,
           "r_sample_777": -0.1, "lr_sample_777": 1.1}
    rows = [{"scorer": "sl", "trace": "t0", **row}, {"scorer": "sl", "trace": "t1", **row},
            {"scorer": "grpo", "trace": "t0", **row}]
    (tmp_path / "compare.json").write_text(json.dumps(rows))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "grpo_smollm2" / "summarise.py"
    proc = subprocess.run([sys.executable, str(script), "--exp", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=script.parents[2])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("summarise: error: ") and "different traces (e.g. 't1' in one only)" in lines[0]
    assert proc.stdout == ""
