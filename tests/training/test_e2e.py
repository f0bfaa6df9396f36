"""`foresight train e2e`: the relaxed replay's gradient (finite differences), its hard limit (the `learned` replay),
resume identity and the config's error paths, on a tiny random model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

import foresight
from foresight.policies import make_policy
from foresight.runtime import replay
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model, save_random_traces
from training.adapt_student import StudentKL, full_reference
from training.e2e import relaxed_loss
from training.e2e_policy import RelaxedLearnedPolicy

B, W = 16, 4
REPO = Path(__file__).resolve().parents[2]
DS = str(REPO / "configs" / "deepspeed" / "zero0.json")


def _fp64_model():
    model, _ = get_model("tiny-llama")
    return copy.deepcopy(model).double()  # the session's model stays as it is


def _scorer(model, seed: int = 0, **kw) -> Scorer:
    sc = Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8, **kw), seed=seed)
    with torch.no_grad():  # spread the scores: the hard choice must not sit on a near-tie
        sc.w2.mul_(20.0)
    return sc.to(next(model.parameters()).dtype)


def _seq(n: int, seed: int = 1) -> list[int]:
    return torch.randint(3, 200, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class _Recorder(RelaxedLearnedPolicy):
    """Records the hard choice of every event (layer, kept indices)."""

    def __post_init__(self):
        super().__post_init__()
        self.kept = []

    def select(self, scores, num_keep, view):
        keep = super().select(scores, num_keep, view)
        self.kept.append((view.layer_idx, keep.clone()))
        return keep


class _FixedFeatures(RelaxedLearnedPolicy):
    """The relaxed policy with the scorer's features of every event held at ``fixed`` (those of the unperturbed
    replay): the gradient treats features as constants (straight-through on the trajectory), so the finite
    differences must too."""

    fixed: dict

    def _layer_scores(self, view, feats):
        key = (view.event, view.layer_idx)
        self.fixed.setdefault(key, feats)
        return super()._layer_scores(view, self.fixed[key])


def _loss(model, sc, seq, ref, objective, engine, fixed):
    hook = StudentKL(ref, B + W, seq, with_ce=True)
    policy = _FixedFeatures(scorer=sc, tau=0.5)
    policy.fixed = fixed
    replay(model, [seq], policy, B, W, on_logits=hook, grad=True, engine=engine)
    return hook.ce if objective == "ce" else hook.kl


def _rms_norm_fp64(self, hidden_states):
    """LlamaRMSNorm without its float32 round trip, so that an fp64 model is fp64 throughout (finite differences
    of 1e-6 would otherwise read float32 rounding)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.mark.parametrize("engine", ["layer-major", "piecewise"])
@pytest.mark.parametrize("objective", ["ce", "kl"])
def test_gradient_matches_central_finite_differences(engine, objective, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_norm_fp64)
    model = _fp64_model()
    sc = _scorer(model)
    seq = _seq(44)
    ref = full_reference(model, seq, B + W, W)[0]
    loss, hook = relaxed_loss(model, sc, seq, B, W, tau=0.5, objective=objective, ref=ref, engine=engine)
    assert hook.count == len(seq) - 1 - (B + W)
    loss.backward()
    fixed: dict = {}
    assert _loss(model, sc, seq, ref, objective, engine, fixed).item() == pytest.approx(loss.item(), rel=1e-12)
    gen = torch.Generator().manual_seed(0)
    eps = 1e-6
    checked = 0
    for name in ("w1", "b1", "w2", "b2"):
        p = getattr(sc, name)
        flat = p.data.view(-1)
        for idx in torch.randperm(flat.numel(), generator=gen)[:3].tolist():
            old = flat[idx].item()
            with torch.no_grad():
                flat[idx] = old + eps
                up = _loss(model, sc, seq, ref, objective, engine, fixed).item()
                flat[idx] = old - eps
                down = _loss(model, sc, seq, ref, objective, engine, fixed).item()
                flat[idx] = old
            fd = (up - down) / (2 * eps)
            got = float(p.grad.view(-1)[idx])
            assert got == pytest.approx(fd, rel=1e-4, abs=1e-7), (name, idx, got, fd)
            checked += abs(fd) > 1e-6
    assert checked >= 4  # the gradient is not trivially zero


@pytest.mark.parametrize("tau", [0.0, 1e-7])
def test_hard_limit_equals_the_learned_replay(tau):
    """At tau -> 0 (and tau = 0 exactly) the relaxed replay's per-token CE and every eviction choice are the hard
    `learned` replay's (top-k, spread 0), although the evicted entries stay in attention with their bias."""
    model = _fp64_model()
    sc = _scorer(model, seed=3)
    seqs = [_seq(57, seed=5), _seq(40, seed=6)]
    for seq in seqs:
        hard_pol = make_policy("learned", scorer=sc, selection="topk", spread=0.0)
        hard_kept = []
        orig = hard_pol.select

        def rec(scores, num_keep, view, orig=orig):
            keep = orig(scores, num_keep, view)
            hard_kept.append((view.layer_idx, keep.clone()))
            return keep

        hard_pol.select = rec
        hard = replay(model, [seq], hard_pol, B, W)
        relaxed = _Recorder(scorer=sc, tau=tau)
        soft = replay(model, [seq], relaxed, B, W)
        assert hard.stats["evictions"] == soft.stats["evictions"] > 1
        assert len(hard_kept) == len(relaxed.kept)
        for (la, ka), (lb, kb) in zip(hard_kept, relaxed.kept):
            assert la == lb and torch.equal(ka, kb)
        torch.testing.assert_close(soft.ce, hard.ce, rtol=0, atol=1e-9, equal_nan=True)
    # and a finite temperature does change the loss (the evicted entries are attended with their bias)
    soft = replay(model, [seqs[0]], RelaxedLearnedPolicy(scorer=sc, tau=1.0), B, W)
    hard = replay(model, [seqs[0]], make_policy("learned", scorer=sc, spread=0.0), B, W)
    assert (soft.ce[0, B + W:] - hard.ce[0, B + W:]).abs().max() > 1e-4


def _relaxed_grad(model, sc, seqs, engine, tau=0.5, grad_from=0):
    """Per-token CE of a relaxed replay of ``seqs`` and the gradient of its summed CE (positions >= B + W)."""
    sc.zero_grad()
    res = replay(model, seqs, RelaxedLearnedPolicy(scorer=sc, tau=tau), B, W, grad=True, engine=engine,
                 grad_from=grad_from,
                 on_logits=(hook := StudentKL(None, B + W, seqs[0], with_ce=True)) if len(seqs) == 1 else None)
    if len(seqs) == 1:
        hook.ce.backward()
    return res.ce, [p.grad.clone() for p in (sc.w1, sc.b1, sc.w2, sc.b2)]


def test_relaxed_attention_is_the_same_over_spans_and_pieces(monkeypatch):
    """The relaxed attention runs once per layer-major span over every token so far: spans of three pieces (an
    event inside, bias rows carried across spans) give the per-token CE and gradient of one span and of piecewise
    replay; so do the tokens before the first event fed without gradient (``grad_from``, as train e2e feeds them)."""
    import foresight.runtime as runtime

    model = _fp64_model()
    sc = _scorer(model, seed=2)
    seq = _seq(61, seed=4)
    one_ce, one_grad = _relaxed_grad(model, sc, [seq], "layer-major")
    piece_ce, piece_grad = _relaxed_grad(model, sc, [seq], "piecewise")
    monkeypatch.setattr(runtime, "FULL_PIECE", 3 * W)
    spans_ce, spans_grad = _relaxed_grad(model, sc, [seq], "layer-major")
    later = [_relaxed_grad(model, sc, [seq], engine, grad_from=B + W) for engine in ("layer-major", "piecewise")]
    assert any(g.abs().max() > 1e-6 for g in one_grad)
    for ce, grad in ((piece_ce, piece_grad), (spans_ce, spans_grad), *later):
        torch.testing.assert_close(ce, one_ce, rtol=0, atol=1e-10, equal_nan=True)
        for a, b in zip(grad, one_grad):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("engine", ["layer-major", "piecewise"])
def test_relaxed_rows_of_a_batch_are_the_rows_alone(engine):
    """Right-padded rows of different lengths: each row's relaxed per-token CE is its CE replayed alone (padding
    columns get their own bias and are never attended by a real token)."""
    model = _fp64_model()
    sc = _scorer(model, seed=1)
    seqs = [_seq(57, seed=8), _seq(41, seed=9)]
    both = replay(model, seqs, RelaxedLearnedPolicy(scorer=sc, tau=0.5), B, W, engine=engine).ce
    for i, seq in enumerate(seqs):
        alone = replay(model, [seq], RelaxedLearnedPolicy(scorer=sc, tau=0.5), B, W, engine=engine).ce[0]
        torch.testing.assert_close(both[i, : alone.shape[-1]], alone, rtol=0, atol=1e-10, equal_nan=True)


def test_grad_from_needs_grad():
    model, _ = get_model("tiny-llama")
    with pytest.raises(ValueError, match=r"grad_from=20\) without grad=True"):
        replay(model, [_seq(30)], "h2o", B, W, grad_from=20)


def test_relaxed_policy_refuses_other_selections():
    model, _ = get_model("tiny-llama")
    sc = _scorer(model)
    with pytest.raises(ValueError, match="plain top-k"):
        RelaxedLearnedPolicy(scorer=sc, spread=0.01)
    with pytest.raises(ValueError, match="tau"):
        RelaxedLearnedPolicy(scorer=sc, tau=-1.0)


# ----------------------------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_e2e(tmp_path_factory):
    """Six random-token traces of 30-55 tokens (six problems) and a random tiny scorer directory."""
    root = tmp_path_factory.mktemp("e2e")
    model, _ = get_model("tiny-llama")
    save_random_traces(model, root / "traces", [30 + 5 * i for i in range(6)])
    sc = _scorer(model)
    sc.config.provenance = {"trainer": "test"}
    sc.save_pretrained(root / "scorer")
    return root


def _cfg(root: Path, out: Path, **kw):
    from training.e2e_config import E2EConfig

    base = dict(model="tiny-llama", traces=str(root / "traces"), init_scorer=str(root / "scorer"), out_dir=str(out),
                steps=4, heldout=2, tau=0.5, checkpoint_every=0, lr=1e-2, log_every=1, device="cpu", deepspeed=DS)
    base.update(kw)
    return E2EConfig.from_dict(base)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_second_stage_keeps_the_first_stages_record(tiny_e2e, tmp_path):
    from foresight.scorer import scorer_sha256
    from training.e2e import run_e2e

    model, _ = get_model("tiny-llama")
    run_e2e(_cfg(tiny_e2e, tmp_path / "one", steps=1), model=model)
    run_e2e(_cfg(tiny_e2e, tmp_path / "two", steps=1, init_scorer=str(tmp_path / "one" / "scorer")), model=model)
    one = Scorer.from_pretrained(tmp_path / "one" / "scorer").config.provenance
    two = Scorer.from_pretrained(tmp_path / "two" / "scorer").config.provenance
    assert "earlier_stages" not in one and one["trainer"] == two["trainer"] == "test"
    assert one["e2e"]["init_scorer_sha256"] == scorer_sha256(tiny_e2e / "scorer")
    assert two["e2e"]["init_scorer_sha256"] == scorer_sha256(tmp_path / "one" / "scorer")
    assert two["earlier_stages"] == [{"stage": "e2e", **one["e2e"]}]  # the first stage's record, whole


@pytest.mark.parametrize("name", ["smollm2-135m-b64-w16", "smollm2-135m-b128-w32"])
def test_refining_a_shipped_scorer_keeps_every_stage_it_records(name):
    """The shipped scorers record their e2e stages as ``add_refinement`` does (the last in ``e2e``, the ones before
    in ``earlier_stages``), so a user's further stage moves the last one down and loses none."""
    from dataclasses import dataclass

    from foresight.scorer import scorer_sha256
    from training.provenance import add_refinement

    @dataclass
    class Stage:
        init_scorer: str
        traces: str = "t"

    cfg = Scorer.from_pretrained(name).config
    prov = cfg.provenance
    assert not [k for k in prov if k.startswith(("e2e_", "grpo_")) or k.startswith("refined_from")]
    stages = [*prov.get("earlier_stages", []), {"stage": "e2e", **prov["e2e"]}]
    assert all(s["stage"] == "e2e" and len(s["init_scorer_sha256"]) == 64 and s["train_traces"] for s in stages)
    assert {(s["budget"], s["interval"]) for s in stages} == {(cfg.budget, cfg.interval)}
    out = add_refinement(prov, "e2e", Stage(name), cfg.budget, cfg.interval, [{"trace_id": "x#0"}], [])
    assert out["earlier_stages"] == stages
    assert out["e2e"]["init_scorer_sha256"] == scorer_sha256(name) and out["e2e"]["train_traces"] == ["x#0"]


def test_e2e_trains_and_resume_equals_uninterrupted(tiny_e2e, tmp_path):
    from training.e2e import run_e2e
    from training.logging import read_metrics

    model, _ = get_model("tiny-llama")
    full = run_e2e(_cfg(tiny_e2e, tmp_path / "full"), model=model)
    assert full["finished"] and full["skipped"] == 0
    before = full["eval_before"]
    assert before["heldout_vs_init_mean"] == 0.0  # before training the scorer is the initial one
    assert before["heldout_loss_ratio"] == before["heldout_loss_ratio_init"] == full["eval"]["heldout_loss_ratio_init"]
    init, final = _weights(tiny_e2e / "scorer"), _weights(tmp_path / "full" / "scorer")
    assert any(not torch.equal(init[k], final[k]) for k in ("w1", "w2", "b1"))  # it learned something
    assert torch.equal(init["feature_mean"], final["feature_mean"])  # the normaliser is a buffer, untouched
    saved = Scorer.from_pretrained(tmp_path / "full" / "scorer")
    assert saved.config.provenance["trainer"] == "test" and saved.config.provenance["e2e"]["init_scorer"]
    recs = [r for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and all(r["positions"] > 0 for r in recs)

    part = run_e2e(_cfg(tiny_e2e, tmp_path / "part", checkpoint_every=2, max_steps_per_run=2), model=model)
    assert not part["finished"]
    resumed = run_e2e(_cfg(tiny_e2e, tmp_path / "part", checkpoint_every=2), resume=True, model=model)
    assert resumed["start"] == 2 and resumed["finished"]
    b = _weights(tmp_path / "part" / "scorer")
    for k in final:
        assert torch.equal(b[k], final[k]), k
    recs_b = [r for r in read_metrics(tmp_path / "part" / "metrics.jsonl") if r["kind"] == "train"]
    for ra, rb in zip(recs, recs_b):
        for key in ("loss", "relaxed_ce", "positions"):
            assert ra[key] == rb[key], (ra["step"], key)
        assert "relaxed_kl" not in ra  # objective ce: no full-cache reference is computed
    assert resumed["eval"] == full["eval"]


@pytest.mark.parametrize("objective, calls", [("ce", 0), ("kl", 6)])
def test_e2e_keeps_no_full_cache_reference_across_steps(tiny_e2e, tmp_path, monkeypatch, objective, calls):
    """The full cache's log-probs are a trace's whole distributions (about 100 MB for 512 SmolLM2 tokens): objective
    ce never computes them, kl computes them for each step's trace and keeps none, so a run's memory does not grow
    with the number of traces it has seen (it held every trace's, and a 92-trace run passed 13 GB)."""
    import training.e2e as e2e
    from training.logging import read_metrics

    made = []

    def counted(*args, **kwargs):
        ref = real(*args, **kwargs)
        made.append(ref)
        return ref

    real = e2e.full_reference
    monkeypatch.setattr(e2e, "full_reference", counted)
    model, _ = get_model("tiny-llama")
    out = tmp_path / objective
    e2e.run_e2e(_cfg(tiny_e2e, out, steps=6, objective=objective, eval_before=False), model=model)
    assert len(made) == calls  # one per step (micro_batch 1) over four training traces: the same trace again too
    recs = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert len(recs) == 6 and all(("relaxed_kl" in r) == (objective == "kl") for r in recs)


def test_the_yaml_lists_exactly_the_config_keys():
    from training.e2e_config import E2EConfig

    keys = yaml.safe_load((REPO / "configs" / "e2e.yaml").read_text())
    assert sorted(keys) == sorted(E2EConfig.keys())


@pytest.mark.parametrize("override, names", [
    (["tau=0"], "tau"),
    (["objective=mse"], "objective"),
    (["temperature=0.1"], "temperature"),
    (["max_tokens=-1"], "max_tokens"),
    (["heldout=1.5"], "heldout"),
    (["init_scorer="], "init_scorer"),
    (["lr=fast"], "lr"),
], ids=["tau", "objective", "unknown-key", "max_tokens", "heldout", "no-scorer", "lr-type"])
def test_bad_config_is_one_line_exit_2(tiny_e2e, tmp_path, capsys, override, names):
    from foresight.cli import main

    rc = main(["train", "e2e", f"traces={tiny_e2e / 'traces'}", f"init_scorer={tiny_e2e / 'scorer'}",
               "model=tiny-llama", f"deepspeed={DS}", f"out_dir={tmp_path / 'out'}", *override])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and names in err, err
    assert not (tmp_path / "out").exists()  # refused before any work
