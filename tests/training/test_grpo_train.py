"""`foresight train grpo` end to end on a tiny model: the shared loop, resume, and a 2-rank CPU DeepSpeed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import foresight
from foresight.errors import ForesightError
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model

B, W = 16, 4
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_grpo(tmp_path_factory):
    """Six random-token traces of 38-63 tokens (six problems) and an untrained tiny scorer directory."""
    import datasets

    root = tmp_path_factory.mktemp("grpo")
    model, _ = get_model("tiny-llama")
    fp = foresight.model_fingerprint(model)
    sc = Scorer(ScorerConfig(fp, budget=B, interval=W, hidden=8), seed=0)
    sc.config.provenance = {"trainer": "test"}
    sc.save_pretrained(root / "scorer")
    gen = torch.Generator().manual_seed(0)
    rows = {k: [] for k in ("trace_id", "problem_id", "sample", "input_ids", "prompt_len", "answer", "settings",
                            "fingerprint")}
    for i in range(6):
        rows["trace_id"].append(f"p{i}#0")
        rows["problem_id"].append(f"p{i}")
        rows["sample"].append(0)
        rows["input_ids"].append(torch.randint(3, 200, (38 + 5 * i,), generator=gen).tolist())
        rows["prompt_len"].append(8)
        rows["answer"].append("")
        rows["settings"].append("{}")
        rows["fingerprint"].append(json.dumps(fp))
    datasets.Dataset.from_dict(rows).save_to_disk(str(root / "traces"))
    return root


def _cfg(root: Path, out: Path, **kw):
    from training.grpo import GRPOConfig

    base = dict(model="tiny-llama", traces=str(root / "traces"), init_scorer=str(root / "scorer"), out_dir=str(out),
                steps=4, inner_epochs=2, group_size=3, heldout=2, temperature=1.0, checkpoint_every=0, lr=1e-2, log_every=1,
                eval_traces=1, eval_group_size=2, device="cpu",
                deepspeed=str(REPO / "configs" / "deepspeed" / "zero0.json"))
    base.update(kw)
    return GRPOConfig.from_dict(base)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_grpo_trains_and_resume_equals_uninterrupted(tiny_grpo, tmp_path):
    from training.grpo import run_grpo
    from training.logging import read_metrics

    model, _ = get_model("tiny-llama")
    full = run_grpo(_cfg(tiny_grpo, tmp_path / "full"), model=model)
    assert full["finished"] and full["skipped"] == 0
    for key in ("heldout_reward_sample", "heldout_reward_topk", "heldout_loss_ratio_topk", "heldout_loss_ratio_sample"):
        assert key in full["eval"] and key in full["eval_before"]
    for key in ("heldout_vs_sl_mean", "heldout_vs_sl_ci_low", "heldout_vs_sl_ci_high"):
        assert key in full["eval"] and key in full["eval_before"]
    assert full["eval_before"]["heldout_vs_sl_mean"] == 0.0  # before training the policy is the SL scorer
    recs = read_metrics(tmp_path / "full" / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert [r["inner_epoch"] for r in train] == [0, 1, 0, 1]
    assert "rollout_seconds" in train[0] and "rollout_seconds" not in train[1]  # rollouts reused by epoch 2
    assert train[0]["ratio_mean"] == pytest.approx(1.0) and train[0]["kl_k3"] == pytest.approx(0.0, abs=1e-7)
    assert train[1]["beta"] < train[0]["beta"]
    init, final = _weights(tiny_grpo / "scorer"), _weights(tmp_path / "full" / "scorer")
    assert any(not torch.equal(init[k], final[k]) for k in ("w1", "w2", "b1"))  # it learned something
    assert torch.equal(init["feature_mean"], final["feature_mean"])  # the normaliser is a buffer, untouched
    exported = json.loads((tmp_path / "full" / "scorer" / "config.json").read_text())
    assert exported["temperature"] == 1.0  # the sampling temperature it was trained at, `learned`'s default
    prov = exported["provenance"]
    assert prov["trainer"] == "test" and prov["grpo"]["init_scorer"] == str(tiny_grpo / "scorer")

    # stop after 2 steps (a rollout boundary), then --resume: same weights as the uninterrupted run
    part = run_grpo(_cfg(tiny_grpo, tmp_path / "part", checkpoint_every=2, max_steps_per_run=2), model=model)
    assert not part["finished"]
    resumed = run_grpo(_cfg(tiny_grpo, tmp_path / "part", checkpoint_every=2), resume=True, model=model)
    assert resumed["start"] == 2 and resumed["finished"] and "eval_before" not in resumed
    b = _weights(tmp_path / "part" / "scorer")
    for k in final:
        torch.testing.assert_close(b[k], final[k], rtol=0, atol=1e-7, msg=k)


def test_grpo_trains_with_per_event_advantages(tiny_grpo, tmp_path):
    from training.grpo import run_grpo

    model, _ = get_model("tiny-llama")
    out = run_grpo(_cfg(tiny_grpo, tmp_path / "pe", advantage="per_event", eval_before=False), model=model)
    assert out["finished"] and out["skipped"] == 0
    init, final = _weights(tiny_grpo / "scorer"), _weights(tmp_path / "pe" / "scorer")
    assert any(not torch.equal(init[k], final[k]) for k in ("w1", "w2", "b1"))


def test_grpo_at_another_budget_records_the_setting_it_refined(tiny_grpo, tmp_path):
    """GRPO may refine a scorer at a (B, W) other than its own (a deliberate choice in the config): it runs there
    (the learned policy would refuse a silent mismatch), and the result records the setting it was refined at, with
    the recent-query window the scorer was trained with (its features stay the ones it learned from)."""
    from training.grpo import run_grpo

    model, _ = get_model("tiny-llama")
    out = run_grpo(_cfg(tiny_grpo, tmp_path / "b12", budget=12, interval=3, steps=2, eval_before=False),
                   model=model)
    assert out["finished"]
    cfg = json.loads((tmp_path / "b12" / "scorer" / "config.json").read_text())
    assert (cfg["budget"], cfg["interval"], cfg["window"]) == (12, 3, W)


def test_cli_lists_grpo_and_rejects_bad_keys(tiny_grpo, capsys):
    from foresight.cli import main

    assert main(["train", "grpo", f"traces={tiny_grpo / 'traces'}", f"init_scorer={tiny_grpo / 'scorer'}",
                 "group_size=1"]) == 2
    assert "group_size" in capsys.readouterr().err


def test_a_fresh_run_removes_an_earlier_runs_summary_first(tiny_grpo, tmp_path, monkeypatch):
    """A fresh run into an out_dir without checkpoints left the earlier run's summary.json until its own end: one
    that failed after saving its artefact left a summary whose numbers export quoted for the new weights. A finished
    run is now refused without --overwrite, and an --overwrite run removes it before training."""
    import training.loop as loop
    from training.grpo import run_grpo

    model, _ = get_model("tiny-llama")
    out = tmp_path / "run"
    assert run_grpo(_cfg(tiny_grpo, out, steps=2, eval_before=False), model=model)["finished"]
    assert (out / "summary.json").is_file()

    def boom(*a, **k):
        raise RuntimeError("killed")

    with pytest.raises(ForesightError, match="holds an earlier run"):  # kept, unless replaced on purpose
        run_grpo(_cfg(tiny_grpo, out, steps=2, eval_before=False, lr=5e-2), model=model)
    monkeypatch.setattr(loop, "train", boom)
    with pytest.raises(RuntimeError, match="killed"):
        run_grpo(_cfg(tiny_grpo, out, steps=2, eval_before=False, lr=5e-2), model=model, overwrite=True)
    assert not (out / "summary.json").exists()


def test_a_ref_scorer_of_other_features_is_refused_before_the_model_loads(tiny_grpo, tmp_path, capsys):
    """The KL term scores the rollouts' features (made by init_scorer's extractor) with ref_scorer: one of another
    feature set ran with exit 0 and a KL on features it never saw (or a shape error, exit 1, after the rollouts)."""
    from foresight.cli import main

    model, _ = get_model("tiny-llama")
    fp = foresight.model_fingerprint(model)
    for name, cfg in (("other_features", ScorerConfig(fp, budget=B, interval=W, hidden=8,
                                                       feature_set=("prekey", "value", "attn"))),
                      ("other_decay", ScorerConfig(fp, budget=B, interval=W, hidden=8, decay=0.5))):
        Scorer(cfg, seed=1).save_pretrained(tmp_path / name)
        assert main(["train", "grpo", "model=no-such-model", f"traces={tiny_grpo / 'traces'}",
                     f"init_scorer={tiny_grpo / 'scorer'}", f"ref_scorer={tmp_path / name}",
                     f"out_dir={tmp_path / 'out'}"]) == 2
        err = capsys.readouterr().err.strip()
        key = "feature_set" if name == "other_features" else "decay"
        assert len(err.splitlines()) == 1 and f"ref_scorer {tmp_path / name}: its {key}" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_rank_cpu_deepspeed_grpo_run_and_resume(tiny_grpo, tmp_path):
    """`torchrun --nproc_per_node 2 -m foresight train grpo` on CPU: 1 step, stop, --resume to 2 steps."""
    out = tmp_path / "ddp"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))

    def launch(*extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29741",
               "-m", "foresight", "train", "grpo", "--config", str(REPO / "configs" / "grpo.yaml"),
               "model=tiny-llama", f"traces={tiny_grpo / 'traces'}", f"init_scorer={tiny_grpo / 'scorer'}",
               "heldout=2", "steps=2", "group_size=2", "checkpoint_every=1", "eval_traces=1", "eval_group_size=2",
               f"out_dir={out}", "device=cpu", f"deepspeed={REPO / 'configs' / 'deepspeed' / 'zero0.json'}", *extra]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    launch("max_steps_per_run=1")
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert not (out / "scorer").exists()
    proc = launch("--resume")
    assert "resumed from step 1" in proc.stdout
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["start"] == 1 and summary["skipped"] == 0
    assert "heldout_loss_ratio_topk" in summary["eval"]
    Scorer.from_pretrained(out / "scorer")


def test_grpo_starts_from_a_shipped_scorer_by_short_name(tiny_grpo, tmp_path, monkeypatch):
    """init_scorer may be a shipped scorer's short name (as everywhere a scorer directory is taken): the run's
    resume identity digests the resolved directory instead of failing on ``NAME/config.json`` after the eval."""
    import shutil

    import foresight.scorer as scorer_mod
    from training.grpo import run_grpo

    shutil.copytree(tiny_grpo / "scorer", tmp_path / "shipped" / "tiny-b16")
    monkeypatch.setattr(scorer_mod, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.chdir(tmp_path)  # the name is not also a relative directory here
    model, _ = get_model("tiny-llama")
    out = run_grpo(_cfg(tiny_grpo, tmp_path / "named", init_scorer="tiny-b16", steps=2, eval_before=False,
                        checkpoint_every=2),
                   model=model)
    assert out["finished"]
    named = _weights(tmp_path / "named" / "scorer")
    by_path = run_grpo(_cfg(tiny_grpo, tmp_path / "path", steps=2, eval_before=False), model=model)
    assert by_path["finished"]
    ref = _weights(tmp_path / "path" / "scorer")
    for k in ref:
        assert torch.equal(named[k], ref[k]), k  # the same scorer, reached by name or by path
