"""benchmarks/bench_policies.py: interleaved decode throughput, ``learned`` with named scorers side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import foresight
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model, load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_policies.py"


def test_named_scorers_are_timed_as_learned_variants(tmp_path):
    model, _ = get_model("tiny-llama")
    for name, hidden in (("narrow", 4), ("wide", 12)):
        Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=16, interval=4, hidden=hidden),
               seed=0).save_pretrained(tmp_path / name)
    out = tmp_path / "bench.json"
    assert load_script("bench_policies.py").main([
        "--model", "tiny-llama", "--policies", "streaming_llm", "--budget", "16", "--interval", "4",
        "--new-tokens", "24", "--reps", "1", "--scorer", f"narrow={tmp_path / 'narrow'}",
        "--scorer", f"wide={tmp_path / 'wide'}", "--out", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"streaming_llm", "learned:narrow", "learned:wide"}
    assert rows["learned:wide"]["observes_attention"] and rows["streaming_llm"]["ratio_vs_streaming_llm"] == 1.0


def test_a_bad_scorer_option_is_one_line_and_exit_2(tmp_path):
    for spec, why in (("no-equals-sign", "expected NAME=DIR"), ("=dir", "expected NAME=DIR"), ("a=x", "given twice")):
        args = ["--scorer", spec] + (["--scorer", "a=y"] if spec == "a=x" else [])
        res = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-llama", *args,
                              "--out", str(tmp_path / "b.json")], capture_output=True, text=True, cwd=REPO)
        assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and why in res.stderr, res.stderr
    assert not (tmp_path / "b.json").exists()


def test_what_would_fail_after_the_model_load_is_refused_before_it(tmp_path, capsys):
    """An unknown --policies name, a policy that does not take (B, W) (paged at W=4), W >= B and an --out that is a
    directory (or under a file) were tracebacks after the model load and warm-up (--out: after the whole benchmark);
    --reps 0 a StatisticsError at the end. The default policy list leaves out what cannot run at (B, W)."""
    import pytest

    from foresight.errors import ForesightError

    mod = load_script("bench_policies.py")
    base = ["--model", "no-such-model", "--budget", "16", "--interval", "4", "--out", str(tmp_path / "b.json")]
    for extra, match in ((["--policies", "h2o,nope"], "--policies 'nope': unknown policy"),
                         (["--policies", "paged"], "--policies 'paged': paged: block_size"),
                         (["--policies", "h2o", "--interval", "16"], "--budget/--interval: interval \\(16\\)"),
                         (["--policies", "h2o", "--out", str(tmp_path)], "is a directory"),
                         (["--policies", "h2o", "--out", str(tmp_path / "f" / "sub" / "b.json")],
                          "f is not a directory")):
        (tmp_path / "f").write_text("a file where a folder of --out would be made")
        with pytest.raises(ForesightError, match=match):
            mod.main([*base, *extra])
    with pytest.raises(SystemExit) as exc:
        mod.main([*base, "--reps", "0"])
    assert exc.value.code == 2 and "--reps: must be a positive integer" in capsys.readouterr().err
    # a scorer of another (B, W) was refused only after the model load
    model, _ = get_model("tiny-llama")
    Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=32, interval=8), seed=0).save_pretrained(
        tmp_path / "b32")
    with pytest.raises(ForesightError, match="--scorer a=.*b32: .*is for B=32 W=8, not B=16 W=4"):
        mod.main([*base, "--policies", "h2o", "--scorer", f"a={tmp_path / 'b32'}"])
    assert "paged" not in mod.default_policies(16, 4) and "paged" in mod.default_policies(256, 64)
    assert not (tmp_path / "b.json").exists()
