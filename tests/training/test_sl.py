"""Distillation (`foresight train sl`): loss, metrics, gradient isolation, the shared DeepSpeed loop, resume."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import foresight
from foresight.errors import ForesightError
from tests.conftest import run_in_progress
from training.loop import StepSampler, TrainerConfig, lr_lambda
from training.ranking import evict_overlap, pairwise_hinge_loss, ranking_metrics, row_auc
from training.sl_config import SLConfig

B, W = 16, 4
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------------------
# Loss and metrics against brute force
# ---------------------------------------------------------------------------------------------------------------


def _naive_hinge(scores, alpha, m):
    L = scores.shape[0]
    s, a = scores.reshape(L, -1, scores.shape[-1]), alpha.reshape(L, -1, alpha.shape[-1])
    total = 0.0
    for layer in range(L):
        rows = []
        for r in range(s.shape[1]):
            vals = [max(0.0, m - (s[layer, r, j].item() - s[layer, r, i].item()))  # o_i > o_j <=> alpha_i < alpha_j
                    for i, j in itertools.product(range(s.shape[2]), repeat=2) if a[layer, r, i] < a[layer, r, j]]
            if vals:
                rows.append(sum(vals) / len(vals))
        total += sum(rows) / len(rows) if rows else 0.0
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairwise_hinge_matches_double_loop(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, 2, 4, 7, generator=g) * 0.02
    alpha = torch.randint(0, 4, (3, 2, 4, 7), generator=g).float()  # ties on purpose
    alpha[1, 0, 0] = 1.0  # a row with no ordered pair is left out of the mean
    total, per_layer = pairwise_hinge_loss(scores, alpha, margin=0.01)
    assert total.item() == pytest.approx(_naive_hinge(scores, alpha, 0.01), rel=1e-5, abs=1e-7)
    assert per_layer.shape == (3,)


def _naive_gap_hinge(scores, alpha, m, evicted=None):
    """Each ordered pair weighted by alpha_j - alpha_i (with ``evicted``: only pairs of i evicted, j kept); a row's
    loss is the weighted mean."""
    total = 0.0
    for layer in range(scores.shape[0]):
        c = scores.shape[-1]
        s, a = scores[layer].reshape(-1, c), alpha[layer].reshape(-1, c)
        e = None if evicted is None else evicted[layer].reshape(-1, c)
        rows = []
        for r in range(s.shape[0]):
            num = den = 0.0
            for i, j in itertools.product(range(c), repeat=2):
                w = a[r, j].item() - a[r, i].item()
                if w > 0 and (e is None or (e[r, i] and not e[r, j])):
                    num += w * max(0.0, m - (s[r, j].item() - s[r, i].item()))
                    den += w
            if den > 0:
                rows.append(num / den)
        total += sum(rows) / len(rows) if rows else 0.0
    return total


@pytest.mark.parametrize("seed", [0, 1])
def test_gap_weighted_hinge_matches_double_loop(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, 3, 6, generator=g) * 0.02
    alpha = torch.rand(2, 3, 6, generator=g) ** 3
    alpha[0, 1] = 0.5  # a row of ties has no ordered pair
    total, _ = pairwise_hinge_loss(scores, alpha, margin=0.01, pair_weight="gap")
    assert total.item() == pytest.approx(_naive_gap_hinge(scores, alpha, 0.01), rel=1e-5, abs=1e-7)
    # the weighting changes the loss: one swapped pair of large gap now dominates a row
    uniform, _ = pairwise_hinge_loss(scores, alpha, margin=0.01)
    assert abs(total.item() - uniform.item()) > 1e-4
    with pytest.raises(ValueError, match="pair_weight"):
        pairwise_hinge_loss(scores, alpha, pair_weight="lambda")


@pytest.mark.parametrize("seed", [0, 1])
def test_boundary_weighted_hinge_matches_double_loop(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, 3, 7, generator=g) * 0.02
    alpha = torch.rand(2, 3, 7, generator=g) ** 3
    evicted = torch.zeros(2, 3, 7, dtype=torch.bool)
    evicted.scatter_(-1, alpha.argsort(-1)[..., :3], True)  # the oracle evicts the 3 lowest
    evicted[1, 2] = False  # a row without an evicted entry has no boundary pair
    total, _ = pairwise_hinge_loss(scores, alpha, margin=0.01, pair_weight="boundary", evicted=evicted)
    assert total.item() == pytest.approx(_naive_gap_hinge(scores, alpha, 0.01, evicted), rel=1e-5, abs=1e-7)
    gap, _ = pairwise_hinge_loss(scores, alpha, margin=0.01, pair_weight="gap")
    assert abs(total.item() - gap.item()) > 1e-4  # pairs on one side of the boundary no longer count
    # scores that put every evicted entry a margin below every kept one, in the wrong order within each side:
    # no boundary loss, while the gap weighting still counts the disorder
    sep = -alpha + 2.0 * (~evicted).float()
    assert pairwise_hinge_loss(sep, alpha, 0.01, pair_weight="boundary", evicted=evicted)[0].item() == 0.0
    assert pairwise_hinge_loss(sep, alpha, 0.01, pair_weight="gap")[0].item() > 0.0
    sampled = torch.stack([pairwise_hinge_loss(scores, alpha, 0.01, max_pairs=200, generator=g,
                                               pair_weight="boundary", evicted=evicted)[0] for _ in range(100)])
    assert sampled.mean().item() == pytest.approx(total.item(), rel=0.05)
    with pytest.raises(ValueError, match="evicted"):
        pairwise_hinge_loss(scores, alpha, pair_weight="boundary")
    with pytest.raises(ValueError, match="evicted"):
        pairwise_hinge_loss(scores, alpha, pair_weight="gap", evicted=evicted)
    with pytest.raises(ValueError, match="shape"):
        pairwise_hinge_loss(scores, alpha, pair_weight="boundary", evicted=evicted[..., :5])


def test_sampled_pairs_estimate_the_full_loss():
    g = torch.Generator().manual_seed(0)
    scores, alpha = torch.randn(2, 6, 10, generator=g), torch.rand(2, 6, 10, generator=g)
    full, _ = pairwise_hinge_loss(scores, alpha, margin=0.5)
    est = torch.stack([pairwise_hinge_loss(scores, alpha, 0.5, max_pairs=40, generator=g)[0] for _ in range(300)])
    assert est.mean().item() == pytest.approx(full.item(), rel=0.05)


def test_evict_overlap_and_auc_brute_force():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(20, 12, generator=g)
    evicted = torch.zeros(20, 12, dtype=torch.bool)
    for r in range(20):
        evicted[r, torch.randperm(12, generator=g)[:4]] = True
    got = evict_overlap(scores, evicted)
    for r in range(20):
        pred = set(scores[r].argsort()[:4].tolist())
        gold = set(evicted[r].nonzero().flatten().tolist())
        assert got[r].item() == pytest.approx(len(pred & gold) / 4)
    perfect = ranking_metrics(-evicted.float() + 0.01 * scores, evicted)  # evicted entries score lowest
    assert perfect["overlap"] == 1.0 and perfect["auc"] == 1.0
    inverted = ranking_metrics(evicted.float(), evicted)
    assert inverted["overlap"] == 0.0 and inverted["auc"] == 0.0


def test_row_auc_equals_sklearn_per_row_ties_and_one_class_rows_included():
    from sklearn.metrics import roc_auc_score
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 6, (40, 15), generator=g).float()  # few distinct values: many ties
    scores[:20] = torch.randn(20, 15, generator=g)
    evicted = torch.rand(40, 15, generator=g) < 0.3
    evicted[3], evicted[4] = False, True  # one class only: no AUC
    got = row_auc(scores, evicted)
    for r in range(40):
        y = evicted[r].numpy()
        if 0 < y.sum() < 15:
            assert got[r].item() == pytest.approx(roc_auc_score(y, -scores[r].numpy()), abs=1e-12)
        else:
            assert got[r].isnan()
    sampled = ranking_metrics(scores, evicted, max_rows=25, seed=3)
    rows = torch.randperm(40, generator=torch.Generator().manual_seed(3))[:25].tolist()
    want = [roc_auc_score(evicted[r].numpy(), -scores[r].numpy()) for r in rows if 0 < evicted[r].sum() < 15]
    assert sampled["auc"] == pytest.approx(sum(want) / len(want), abs=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        row_auc(torch.full((2, 3), float("nan")), evicted[:2, :3])


def test_sampler_is_a_function_of_step_and_shards_across_ranks():
    s2 = StepSampler(num_items=23, per_rank=3, world_size=2, seed=5)
    for step in range(12):
        a, b = s2.batch(step, 0), s2.batch(step, 1)
        assert len(a) == len(b) == 3 and not set(a) & set(b)
        assert a == StepSampler(23, 3, 2, 5).batch(step, 0)  # no hidden state
    epoch0 = [i for step in range(s2.steps_per_epoch) for r in (0, 1) for i in s2.batch(step, r)]
    assert len(set(epoch0)) == len(epoch0)  # no repeats within an epoch
    tiny = StepSampler(num_items=2, per_rank=3, world_size=1, seed=0)
    assert len(tiny.batch(0, 0)) == 3


def test_lr_schedule_warmup_then_cosine():
    f = lr_lambda(warmup=4, total=14, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(14) == pytest.approx(0.1)


def test_config_validation(tmp_path):
    with pytest.raises(ValueError, match="unknown config key"):
        SLConfig.from_dict({"traces": "t", "labels": "l", "lrr": 1})
    with pytest.raises(ValueError, match="traces"):
        SLConfig.from_dict({})
    with pytest.raises(ValueError, match=r"`traces\[1\]` must be a string"):
        SLConfig.from_dict({"traces": ["t", 3], "labels": "l"})
    assert SLConfig.from_dict({"traces": ["t", "u"], "labels": "l"}).traces == ["t", "u"]
    for labels in (5, ["l", None], ["l", ""]):  # a TypeError (exit 1) once the labels were read
        with pytest.raises(ValueError, match="labels must be a `foresight golden` directory or a list"):
            SLConfig.from_dict({"traces": "t", "labels": labels})
    assert SLConfig.from_dict({"traces": "t", "labels": ["l", "m"]}).labels == ["l", "m"]
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\], got 1.5"):  # found after the model load
        SLConfig.from_dict({"traces": "t", "labels": "l", "decay": 1.5})
    with pytest.raises(ValueError, match="feature set"):
        SLConfig.from_dict({"traces": "t", "labels": "l", "feature_set": ["key", "bogus"]})
    with pytest.raises(ValueError, match="report_to"):
        TrainerConfig(report_to="tensorboard")
    import yaml

    keys = set(yaml.safe_load((REPO / "configs" / "sl.yaml").read_text()))
    assert keys == set(SLConfig.keys())  # configs/sl.yaml documents every key, and only real keys


def test_a_time_slice_that_ends_before_a_checkpoint_is_refused():
    """An invocation that stops (max_steps_per_run) before it reaches a checkpoint leaves nothing new to resume from:
    every --resume would redo the same steps from the same checkpoint and the run would never finish."""
    for every in (50, 0):
        with pytest.raises(ValueError, match="max_steps_per_run=30 stops before the next checkpoint"):
            TrainerConfig(steps=100, checkpoint_every=every, max_steps_per_run=30)
    TrainerConfig(steps=100, checkpoint_every=25, max_steps_per_run=30)  # saves at least once per invocation
    TrainerConfig(steps=100, checkpoint_every=0, max_steps_per_run=100)  # never stops early


def test_cli_reports_config_errors(capsys):
    from foresight.cli import main

    assert main(["train", "sl", "--config", str(REPO / "configs" / "sl.yaml"), "bogus_key=1"]) == 2
    assert "bogus_key" in capsys.readouterr().err
    # a shipped scorer of another network than the config's: one line naming the key, before any model loads
    assert main(["train", "sl", "--config", str(REPO / "configs" / "sl.yaml"),
                 "init_scorer=smollm2-135m-b64-w16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "init_scorer smollm2-135m-b64-w16 has feature_set=" in err and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------------------------------------------------------
# Tiny end-to-end data: traces + golden labels on tiny-llama
# ---------------------------------------------------------------------------------------------------------------


def _make_data(root: Path, n: int = 6, seed: int = 0, base_len: int = 36, sample: int = 0,
               measure: str = "attention") -> tuple[Path, Path]:
    """``n`` random tiny-llama traces of ``base_len + 4 i`` tokens (problem ``p<i>``, trace ``p<i>#<sample>``) and
    their golden labels (by the oracle of ``measure``)."""
    import datasets

    from golden.labels import save_labels
    from golden.oracle import label_trace

    model, _ = foresight.load_model("tiny-llama", device="cpu")
    fp = json.dumps(foresight.model_fingerprint(model))
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ids = torch.randint(3, 250, (base_len + 4 * i,), generator=g).tolist()
        rows.append(dict(trace_id=f"p{i}#{sample}", problem_id=f"p{i}", sample=sample, input_ids=ids, prompt_len=4, answer="",
                         settings="{}", fingerprint=fp))
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "traces"))
    labels = [label_trace(model, torch.tensor([r["input_ids"]]), B, W, r["trace_id"], measure=measure) for r in rows]
    save_labels(root / "labels.safetensors", labels)
    return root / "traces", root / "labels.safetensors"


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return _make_data(tmp_path_factory.mktemp("sl_data"))


def _cfg(tiny_data, out, **kw) -> SLConfig:
    traces, labels = tiny_data
    base = dict(model="tiny-llama", traces=str(traces), labels=str(labels), budget=B, interval=W, heldout=2,
                steps=8, micro_batch=2, warmup_steps=2, checkpoint_every=0, log_every=1, eval_every=0,
                eval_fidelity=False, out_dir=str(out), feature_cache=str(out.parent / "features"), device="cpu",
                deepspeed=str(REPO / "configs" / "deepspeed" / "zero0.json"))
    base.update(kw)
    return SLConfig.from_dict(base)


def test_two_trace_sets_train_together_and_split_by_problem(tiny_data, tmp_path):
    # a second sample of each problem in another set: both sets' traces are used, both samples of a held-out
    # problem are held out; a trace in two sets, or labels of one trace in two label sets, is refused
    from training.sl import SLData

    more = _make_data(tmp_path, seed=1, sample=1)
    out = tmp_path / "run"
    data = SLData(_cfg(tiny_data, out, traces=[str(tiny_data[0]), str(more[0])],
                       labels=[str(tiny_data[1]), str(more[1])]))
    rows = data.train_rows + data.val_rows
    assert sorted(r["trace_id"] for r in rows) == sorted(f"p{i}#{s}" for i in range(6) for s in (0, 1))
    held = {r["problem_id"] for r in data.val_rows}
    assert len(held) == 2 and len(data.val_rows) == 4
    assert not held & {r["problem_id"] for r in data.train_rows}
    assert held == {r["problem_id"] for r in SLData(_cfg(tiny_data, out)).val_rows}  # the same problems held out
    with pytest.raises(ForesightError, match=r"'p0#0' is in both"):
        SLData(_cfg(tiny_data, out, traces=[str(tiny_data[0]), str(tiny_data[0])]))
    with pytest.raises(ForesightError, match=r"'p0#0' .*labelled in both"):
        SLData(_cfg(tiny_data, out, labels=[str(tiny_data[1]), str(tiny_data[1])]))


def test_labels_of_two_oracles_are_not_trained_on_together(tiny_data, tmp_path):
    # a second sample labelled by the output-error oracle (`foresight golden --measure output`): alone it trains and
    # the scorer's provenance names the measure; beside attention labels it is refused before the model loads
    from golden.labels import LabelMismatchError
    from training.sl import SLData, _measure_of

    more = _make_data(tmp_path, seed=1, sample=1, measure="output")
    out = tmp_path / "run"
    alone = SLData(_cfg(tiny_data, out, traces=str(more[0]), labels=str(more[1])))
    assert _measure_of(alone.labels) == {"label_measure": "output"}
    assert _measure_of(SLData(_cfg(tiny_data, out)).labels) == {}  # attention: the provenance as before
    with pytest.raises(LabelMismatchError, match=r"\(measure attention\) and .* \(measure output\) were made by "
                                                 "different oracles"):
        SLData(_cfg(tiny_data, out, traces=[str(tiny_data[0]), str(more[0])], labels=[str(tiny_data[1]), str(more[1])]))


def test_gradients_reach_only_the_scorer(tiny_data):
    from foresight.scorer import Scorer, ScorerConfig
    from foresight.tiny_models import build_tiny_model
    from golden.labels import load_labels
    from training.sl_features import collect_events

    model, _ = build_tiny_model("tiny-llama")  # a private copy we may unfreeze
    model.eval()
    model.requires_grad_(True)  # even an unfrozen LLM must get no gradient from the distillation loss
    import datasets

    rows = list(datasets.load_from_disk(str(tiny_data[0])))[:2]
    labels = load_labels(tiny_data[1])
    cfg = ScorerConfig(foresight.model_fingerprint(model), B, W)
    events = collect_events(model, [r["input_ids"] for r in rows], [r["trace_id"] for r in rows], labels,
                            cfg.extractor, B, W, torch.float32, batch_size=2)
    assert len(events) == 2 and events[0].features.shape[1:4] == (2, 2, B)
    assert events[0].evicted.sum(-1).eq(W).all()  # golden evicts exactly W per (event, layer, head)
    scorer = Scorer(cfg)
    x, a = events[0].features.transpose(0, 1), events[0].alpha.transpose(0, 1)
    assert not x.requires_grad
    loss, _ = pairwise_hinge_loss(scorer(x), a)
    loss.backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in scorer.parameters())


def test_boundary_pairs_train_on_each_events_recorded_evict_set(tiny_data, tmp_path, monkeypatch):
    import training.sl as sl_mod

    seen = []

    def spy(scores, alpha, *args):
        seen.append((alpha.shape, args[-2], args[-1]))
        return pairwise_hinge_loss(scores, alpha, *args)

    monkeypatch.setattr(sl_mod, "pairwise_hinge_loss", spy)
    sl_mod.run_sl(_cfg(tiny_data, tmp_path / "boundary", steps=3, pair_weight="boundary"))
    assert len(seen) == 3
    for shape, weight, evicted in seen:
        assert weight == "boundary" and evicted.shape == shape and evicted.dtype == torch.bool
        assert evicted.sum(-1).eq(W).all()  # the oracle's W evictions of each (layer, event, head) row
    sl_mod.run_sl(_cfg(tiny_data, tmp_path / "gap", steps=3, pair_weight="gap"))
    assert seen[-1][1:] == ("gap", None)
    b, g = _weights(tmp_path / "boundary" / "scorer"), _weights(tmp_path / "gap" / "scorer")
    assert any(not torch.equal(b[k], g[k]) for k in b)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_loss_window_cut_by_a_resume_says_so(tiny_data, tmp_path):
    """Resumed between two records, the first logged loss averages only the steps after the checkpoint (0.1859 vs
    0.1499 in the audit): that record names its first step, window_from; the others are as uninterrupted."""
    from training.logging import read_metrics
    from training.sl import run_sl

    def train(out):
        return {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"}

    run_sl(_cfg(tiny_data, tmp_path / "full", log_every=4))
    run_sl(_cfg(tiny_data, tmp_path / "part", log_every=4, checkpoint_every=2, max_steps_per_run=2))
    run_sl(_cfg(tiny_data, tmp_path / "part", log_every=4, checkpoint_every=2), resume=True)
    full, part = train(tmp_path / "full"), train(tmp_path / "part")
    assert sorted(full) == sorted(part) == [4, 8] and "window_from" not in full[4] and "window_from" not in full[8]
    assert part[4]["window_from"] == 3 and "window_from" not in part[8]
    assert part[8]["loss"] == pytest.approx(full[8]["loss"], rel=1e-6)


def test_train_resume_equals_uninterrupted_and_nan_steps_are_skipped(tiny_data, tmp_path, monkeypatch):
    from training import loop
    from training.logging import read_metrics
    from training.sl import SLTask, run_sl

    # uninterrupted 8 steps
    full = run_sl(_cfg(tiny_data, tmp_path / "full"))
    assert full["finished"] and full["skipped"] == 0
    # 4 steps, "killed" (the run ends after a checkpoint), then resumed to 8
    part = run_sl(_cfg(tiny_data, tmp_path / "part", checkpoint_every=4, max_steps_per_run=4))
    assert not part["finished"] and (tmp_path / "part" / "checkpoints" / "step_000004").is_dir()
    assert not (tmp_path / "part" / "scorer").exists()
    resumed = run_sl(_cfg(tiny_data, tmp_path / "part", checkpoint_every=4), resume=True)
    assert resumed["start"] == 4 and resumed["finished"]
    a, b = _weights(tmp_path / "full" / "scorer"), _weights(tmp_path / "part" / "scorer")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-7, msg=k)
    ev = [r for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if r["kind"] == "eval"][-1]
    assert 0.0 <= ev["overlap"] <= 1.0 and "random_overlap" in ev

    # NaN in a step's loss: the step is skipped and counted, weights stay finite
    orig = SLTask.loss

    def poisoned(self, model, items, step):
        loss, m = orig(self, model, items, step)
        return (loss * float("nan") if step == 2 else loss), m

    monkeypatch.setattr(SLTask, "loss", poisoned)
    nan_run = run_sl(_cfg(tiny_data, tmp_path / "nan", steps=4))
    assert nan_run["skipped"] == 1
    assert all(torch.isfinite(t).all() for t in _weights(tmp_path / "nan" / "scorer").values())
    assert [r["skipped"] for r in read_metrics(tmp_path / "nan" / "metrics.jsonl") if r["kind"] == "train"] == [0, 0, 1, 1]

    # non-finite gradients with a finite loss are skipped too (the check sees the 2nd step's grads as bad)
    monkeypatch.setattr(SLTask, "loss", orig)
    real_check, calls = loop._grads_finite, []

    def flaky(module):
        calls.append(1)
        return len(calls) != 2 and real_check(module)

    monkeypatch.setattr(loop, "_grads_finite", flaky)
    gr = run_sl(_cfg(tiny_data, tmp_path / "grad", steps=3))
    assert gr["skipped"] == 1 and len(calls) == 3


def test_a_fresh_run_in_a_used_out_dir_logs_only_its_own_metrics(tiny_data, tmp_path):
    """Without --resume a run starts afresh: metrics.jsonl must not keep an earlier run's records (a reader by step
    would mix the two runs' curves), neither one of a run that died before its end (no scorer, no summary) nor, with
    --overwrite, one of a finished run."""
    from training.logging import read_metrics
    from training.sl import run_sl

    run_sl(_cfg(tiny_data, tmp_path / "run", steps=4))
    shutil.rmtree(tmp_path / "run" / "scorer")
    (tmp_path / "run" / "summary.json").unlink()  # as a run killed in its final evaluation leaves it
    run_sl(_cfg(tiny_data, tmp_path / "run", steps=3, lr=0.5))
    recs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in recs] == [("train", 1), ("train", 2), ("train", 3), ("eval", 3)]
    run_sl(_cfg(tiny_data, tmp_path / "run", steps=2, lr=0.5), overwrite=True)
    recs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in recs] == [("train", 1), ("train", 2), ("eval", 2)]


def test_wandb_offline_and_local_jsonl(tiny_data, tmp_path, monkeypatch):
    from training.logging import MetricsLogger, read_metrics

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLogger(tmp_path, report_to="wandb", run_config={"a": 1})
    log.log(1, {"loss": 0.5})
    log.close()
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["loss"] == 0.5
    assert (tmp_path / "wandb").is_dir()
    # wandb missing entirely: a warning, not an error
    monkeypatch.setitem(sys.modules, "wandb", None)
    log = MetricsLogger(tmp_path / "b", report_to="wandb")
    log.log(1, {"loss": 1.0})
    assert read_metrics(tmp_path / "b" / "metrics.jsonl")[0]["loss"] == 1.0


@pytest.mark.slow
def test_two_rank_cpu_deepspeed_run_writes_one_checkpoint(tiny_data, tmp_path):
    """`torchrun --nproc_per_node 2 -m foresight train sl` on CPU (DS_ACCELERATOR=cpu, gloo)."""
    traces, labels = tiny_data
    out = tmp_path / "ddp"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29733",
           "-m", "foresight", "train", "sl", "--config", str(REPO / "configs" / "sl.yaml"),
           "model=tiny-llama", f"traces={traces}", f"labels={labels}", f"budget={B}", f"interval={W}", "heldout=2",
           "steps=4", "micro_batch=2", "warmup_steps=1", "checkpoint_every=4", "log_every=2", "eval_every=0",
           "eval_fidelity=false", f"out_dir={out}", "device=cpu",
           f"deepspeed={REPO / 'configs' / 'deepspeed' / 'zero0.json'}"]
    with run_in_progress(out):  # another run on out_dir: both ranks refuse at once (rank 0 alone takes the lock)
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and proc.stderr.count(f"error: out_dir {out} is in use by another training run") == 2, \
        proc.stderr[-3000:]
    assert not out.exists()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ck = out / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step_000004"
    assert sorted(p.name for p in (ck / "step_000004").iterdir()) == [  # safetensors + JSON, no pickle
        "checkpoint.json", "model.safetensors", "optimizer.safetensors", "rank-00000.safetensors",
        "rank-00001.safetensors", "scorer"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["skipped"] == 0
    from foresight.scorer import Scorer

    Scorer.from_pretrained(out / "scorer")


def test_feature_cache_identity_covers_the_foresight_targets(tiny_data, tmp_path):
    """Labels made again with the same evictions but other α (another dtype or device) are another version: the
    cached α, read back as the training targets, would otherwise be the old labels' while the run records the new."""
    import dataclasses

    import datasets

    from foresight.errors import ForesightError
    from golden.labels import load_labels
    from training.sl import run_sl
    from training.sl_features import FeatureCache, trace_identity

    traces, labels = tiny_data
    run_sl(_cfg(tiny_data, tmp_path / "a", steps=2))
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    rows = list(datasets.load_from_disk(str(traces)))
    lab = load_labels(labels)
    row = next(r for r in rows if lab[r["trace_id"]].events)
    old = lab[row["trace_id"]]
    ev0 = old.events[0]
    new = dataclasses.replace(old, events=[dataclasses.replace(ev0, alpha=ev0.alpha * (1 + 1e-3)), *old.events[1:]])
    assert torch.equal(new.events[0].evicted, ev0.evicted)
    assert trace_identity(row["input_ids"], new) != trace_identity(row["input_ids"], old)
    cache = FeatureCache(tmp_path / "features", foresight.model_fingerprint(model), B, W, 0.9, "float16",
                         groups=("key", "value", "attn"))  # train sl caches its feature set's groups
    with pytest.raises(ForesightError, match="another version of trace"):
        cache.load([row], torch.arange(4), {**lab, row["trace_id"]: new})


def test_a_cache_of_the_scorers_groups_trains_the_scorer_of_a_cache_of_every_group(tiny_data, tmp_path):
    """feature_cache_groups: scorer (the default) extracts and stores only the feature set's groups: smaller files,
    the same columns, so the same scorer byte for byte as from a cache of every group (all); a bad value is refused
    when the config is built."""
    from training.sl import run_sl

    run_sl(_cfg(tiny_data, tmp_path / "mine", steps=4, dagger_rounds=1))
    run_sl(_cfg(tiny_data, tmp_path / "all", steps=4, dagger_rounds=1, feature_cache_groups="all"))
    for name in ("rounds/round-0/scorer/model.safetensors", "scorer/model.safetensors"):
        assert (tmp_path / "mine" / name).read_bytes() == (tmp_path / "all" / name).read_bytes(), name
    caches = sorted((tmp_path / "features").iterdir(), key=lambda d: sum(f.stat().st_size for f in d.iterdir()))
    assert len(caches) == 2
    small, big = ({f.name: f.stat().st_size for f in d.glob("*.safetensors")} for d in caches)
    assert small.keys() == big.keys() and all(small[f] < big[f] for f in small)
    with pytest.raises(ValueError, match="feature_cache_groups must be one of scorer, all, got 'every'"):
        _cfg(tiny_data, tmp_path / "x", feature_cache_groups="every")


def test_features_of_weights_in_another_dtype_are_kept_apart(tmp_path):
    """A run with bfloat16 weights and one with float32 weights shared a feature cache: the second trained on the
    first's features. The weights' dtype keys the cache when it is not float32 (float32 caches keep their key)."""
    import copy
    import hashlib
    import json

    from foresight.features import FEATURE_GROUPS
    from foresight.fingerprint import weights_dtype
    from training.sl_features import FEATURE_CACHE_FORMAT, FeatureCache

    model, _ = foresight.load_model("tiny-llama", device="cpu")
    fp = foresight.model_fingerprint(model)
    plain = FeatureCache(tmp_path, fp, B, W, 0.9, "float16", weights_dtype(model))
    half = FeatureCache(tmp_path, fp, B, W, 0.9, "float16", weights_dtype(copy.deepcopy(model).to(torch.bfloat16)))
    assert weights_dtype(model) == {} and half.dir != plain.dir
    before = json.dumps([fp, B, W, list(FEATURE_GROUPS), 0.9, "float16", FEATURE_CACHE_FORMAT], sort_keys=True)
    assert plain.dir.name == hashlib.sha1(before.encode()).hexdigest()[:16]  # the key caches were made under


def test_feature_cache_never_reuses_events_of_another_version_of_a_trace(tiny_data, tmp_path):
    """A trace regenerated (or relabelled) under the same id must be extracted again, not read from the cache."""
    import datasets

    from golden.labels import load_labels, save_labels
    from golden.oracle import label_trace
    from training.sl import run_sl
    from training.mapped_events import EventRows
    from training.event_files import load_events, saved_metadata
    from training.sl_features import FEATURE_CACHE_FORMAT, FeatureCache, trace_identity
    from foresight.features import FEATURE_GROUPS, feature_columns

    def saved_identity(path):
        return saved_metadata(path).get("identity")

    traces, labels = tiny_data
    run_sl(_cfg(tiny_data, tmp_path / "a", steps=2))
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    rows = list(datasets.load_from_disk(str(traces)))
    cache = FeatureCache(tmp_path / "features", foresight.model_fingerprint(model), B, W, 0.9, "float16",
                         groups=("key", "value", "attn"))  # train sl caches its feature set's groups
    first = rows[0]
    cols = torch.tensor(feature_columns(cache.groups, tuple(FEATURE_GROUPS), cache.head_dim, cache.num_groups))
    before = EventRows([load_events(cache.file(first["trace_id"]), FEATURE_CACHE_FORMAT).features], cols)[:]
    assert saved_identity(cache.file(first["trace_id"])) == trace_identity(first["input_ids"],
                                                                           load_labels(labels)[first["trace_id"]])
    # the same trace id, other tokens after the prompt, relabelled: a new version of the data
    changed = dict(first, input_ids=first["input_ids"][:12] + [(t + 7) % 100 for t in first["input_ids"][12:]])
    root = tmp_path / "v2"
    datasets.Dataset.from_list([changed, *rows[1:]]).save_to_disk(str(root / "traces"))
    save_labels(root / "labels.safetensors",
                [label_trace(model, torch.tensor([r["input_ids"]]), B, W, r["trace_id"]) for r in [changed, *rows[1:]]])
    run_sl(_cfg((root / "traces", root / "labels.safetensors"), tmp_path / "b", steps=2))
    after = EventRows([load_events(cache.file(first["trace_id"]), FEATURE_CACHE_FORMAT).features], cols)[:]
    assert after.shape != before.shape or not torch.equal(after, before)  # extracted again from the new tokens
    new_labels = load_labels(root / "labels.safetensors")
    assert saved_identity(cache.file(first["trace_id"])) == trace_identity(changed["input_ids"],
                                                                           new_labels[first["trace_id"]])
    # an unchanged trace kept its file (same identity): nothing was redone for it
    other = rows[-1]
    assert saved_identity(cache.file(other["trace_id"])) == trace_identity(other["input_ids"],
                                                                           new_labels[other["trace_id"]])


def test_grpo_temperature_reads_a_cache_in_chunks_with_the_same_numbers(tiny_data, tmp_path, capsys):
    """benchmarks/grpo_temperature.py loaded every event of a cache at once (killed for memory on the 332-trace
    B=128 cache); it scores ``--chunk`` events at a time, and the numbers do not depend on the chunk."""
    from tests.conftest import load_script
    from training.sl import run_sl

    run_sl(_cfg(tiny_data, tmp_path / "a", steps=2))
    capsys.readouterr()  # the run's own log
    mod = load_script("grpo_temperature.py")
    args = [str(tmp_path / "a" / "scorer"), str(tmp_path / "features"), "--temperatures", "1,0.01"]
    out = []
    for chunk in ("1", "3", "100000"):
        assert mod.main([*args, "--chunk", chunk]) == 0
        out.append(capsys.readouterr().out)
    assert out[0] == out[1] == out[2], out
    lines = out[0].splitlines()
    assert lines[0].startswith("rows (") and len(lines) == 3 and lines[2].startswith("T=0.01: overlap")
    # a low temperature draws nearly the top-k set, a high one much less of it
    assert float(lines[2].split()[-1]) > float(lines[1].split()[-1])
