"""examples/gpu_recipe.py: the GPU recipe's stages (trace, golden, train sl under DeepSpeed's launcher, eval fidelity,
eval aime, export) run end to end in its --dry-run mode (two CPU ranks, the tiny model), and a rerun resumes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = [sys.executable, str(REPO / "examples" / "gpu_recipe.py"), "--model", "tiny-llama", "--gpus", "2"]


def test_print_only_lists_every_stage_with_its_launcher(tmp_path):
    proc = subprocess.run([*RECIPE, "--out", str(tmp_path / "r"), "--print-only"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("== ")]
    assert [x.split(":")[0] for x in lines] == ["== traces (train)", "== traces (eval)", "== golden labels",
                                                "== train sl", "== eval fidelity", "== eval aime", "== export"]
    assert "deepspeed --num_gpus 2 --module foresight train sl" in lines[3]
    assert "launch --nproc-per-node 2 eval aime" in lines[5] and "--budget 128 --interval 32" in lines[5]
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_dry_run_goes_from_traces_to_an_exported_scorer(tmp_path):
    out = tmp_path / "recipe"
    proc = subprocess.run([*RECIPE, "--out", str(out), "--dry-run"], capture_output=True, text=True, cwd=REPO,
                          timeout=3000)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    records = json.loads((out / "fidelity" / "fidelity.json").read_text())
    assert {r["policy"] for r in records} >= {"full", "learned", "tova", "h2o"}
    assert json.loads((out / "aime" / "summary.json").read_text())["complete"]
    from huggingface_hub import ModelCard

    from foresight.scorer import Scorer

    Scorer.from_pretrained(out / "scorer")
    assert ModelCard.load(out / "scorer" / "README.md").data.eval_results
    rerun = subprocess.run([*RECIPE, "--out", str(out), "--dry-run"], capture_output=True, text=True, cwd=REPO,
                           timeout=3000)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "train sl" in rerun.stdout and "--resume" in rerun.stdout
