"""benchmarks/bench_scorer.py: an untrained scorer of a trained one's architecture at another (B, W)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import foresight
from foresight.errors import ForesightError
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model, load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_scorer.py"


def _module():
    return load_script("bench_scorer.py")


def test_copies_the_architecture_at_the_new_setting(tmp_path):
    model, _ = get_model("tiny-llama")
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=16, interval=4, hidden=8,
                       feature_set=("key", "attn", "age"), decay=0.8, spread=0.005, newcomer_bonus=0.01)
    Scorer(cfg, seed=3).save_pretrained(tmp_path / "trained")
    assert _module().main(["--like", str(tmp_path / "trained"), "--budget", "64", "--interval", "16",
                           "--out", str(tmp_path / "speed")]) == 0
    got = Scorer.from_pretrained(tmp_path / "speed", model=model).config
    assert (got.budget, got.interval) == (64, 16)
    assert (got.feature_set, got.hidden, got.decay, got.fingerprint) == (cfg.feature_set, 8, 0.8, cfg.fingerprint)
    assert (got.spread, got.newcomer_bonus) == (0.005, 0.01)  # the top-k work the policy does (spread's loop)
    assert "untrained" in got.provenance["trainer"]

    # an existing --out (here the trained scorer itself) had its weights replaced by untrained ones
    before = (tmp_path / "trained" / "model.safetensors").read_bytes()
    with pytest.raises(ForesightError, match="--out .*trained exists; choose a new directory"):
        _module().main(["--like", str(tmp_path / "trained"), "--budget", "64", "--interval", "16",
                        "--out", str(tmp_path / "trained")])
    assert (tmp_path / "trained" / "model.safetensors").read_bytes() == before


def test_a_bad_setting_is_one_line_and_exit_2(tmp_path):
    model, _ = get_model("tiny-llama")
    Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=16, interval=4, hidden=8)).save_pretrained(
        tmp_path / "trained")
    res = subprocess.run([sys.executable, str(SCRIPT), "--like", str(tmp_path / "trained"), "--budget", "8",
                          "--interval", "8", "--out", str(tmp_path / "x")], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "0 < interval < budget" in res.stderr
    assert not (tmp_path / "x").exists()


def test_an_out_that_is_a_file_or_under_one_is_one_line_and_exit_2(tmp_path):
    """--out naming a file, or a directory under one, was a traceback from save_config's mkdir."""
    (tmp_path / "f").write_text("a file")
    for out, match in ((tmp_path / "f", "exists and is not a directory"), (tmp_path / "f" / "sub", "f is not a directory")):
        res = subprocess.run([sys.executable, str(SCRIPT), "--like", "smollm2-135m-b64-w16", "--budget", "64",
                              "--interval", "16", "--out", str(out)], capture_output=True, text=True, cwd=REPO)
        assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and match in res.stderr, res.stderr
    assert (tmp_path / "f").read_text() == "a file"
