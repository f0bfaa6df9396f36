"""`foresight train adapt` (docs/training.md, adaptation) on tiny models: gradients through the budgeted replay, the first
step's KL against `eval fidelity`, resume, DeepSpeed on two ranks, the config's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import foresight
from evaluation.fidelity import evaluate_fidelity
from evaluation.policies import make_factory
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import load_script, save_random_traces, seeded_lora
from training.adapt_student import EvictedStudent, distillation_loss

B, W = 16, 4
REPO = Path(__file__).resolve().parents[2]
DS = str(REPO / "configs" / "deepspeed" / "zero0.json")
LENGTHS = [40, 44, 48, 52, 56, 60]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Six random-token traces of six problems (the base tiny-llama's fingerprint) and an untrained scorer."""
    root = tmp_path_factory.mktemp("adapt")
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    rows = save_random_traces(model, root / "traces", LENGTHS, seed=3, prompt_len=8)
    Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8), seed=0) \
        .save_pretrained(root / "scorer")
    return {"root": root, "traces": root / "traces", "scorer": root / "scorer", "rows": rows}


def _cfg(data, out, **kw):
    from training.adapt_config import AdaptConfig

    base = dict(model="tiny-llama", traces=str(data["traces"]), scorer=str(data["scorer"]), budget=B, interval=W,
                out_dir=str(out), steps=4, lr=1e-2, warmup_steps=0, heldout=2, checkpoint_every=0, log_every=1,
                lora_r=2, device="cpu", deepspeed=DS, eval_before=False)
    base.update(kw)
    return AdaptConfig.from_dict(base)


def _student(policy, scorer_dir=None, dtype=torch.float64, seed=0):
    """A fresh tiny-llama with LoRA (non-zero B) in ``dtype``, its EvictedStudent and the scorer if any."""
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    model.to(dtype)
    peft_model = seeded_lora(model, seed=seed).to(dtype)
    scorer = None
    if policy == "learned":
        scorer = Scorer.from_pretrained(scorer_dir, model=model)
        pol = foresight.make_policy("learned", scorer=scorer)
    else:
        pol = foresight.make_policy(policy)
    return peft_model, EvictedStudent(peft_model, pol, B, W), scorer


@pytest.fixture
def fp64_norm(monkeypatch):
    """transformers' LlamaRMSNorm computes in fp32 whatever its input (fp64 is cast down), which would drown a
    finite difference in fp32 rounding; the same norm computed in the input's dtype keeps the forward fp64."""
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)


@pytest.mark.parametrize("policy", ["h2o", "learned"])
def test_kl_gradient_through_the_budgeted_replay_matches_finite_differences(data, policy, fp64_norm):
    peft_model, student, scorer = _student(policy, data["scorer"])
    seq = data["rows"]["input_ids"][2]
    loss, metrics = distillation_loss(student, peft_model, student.lm, [seq], B, W)
    assert metrics["positions"] == len(seq) - 1 - (B + W) and loss.dtype == torch.float64
    loss.backward()
    base = [n for n, p in student.lm.named_parameters() if "lora_" not in n]
    assert base and all(p.grad is None for n, p in student.lm.named_parameters() if "lora_" not in n)
    if scorer is not None:
        assert all(p.grad is None for p in scorer.parameters())
    # gradients of the KL reach LoRA weights of both layers, both A and B, through kept keys and values
    names = ["model-layers-0-self_attn-q_proj-lora_A-default-weight", "model-layers-1-self_attn-v_proj-lora_B-default-weight",
             "model-layers-0-self_attn-v_proj-lora_A-default-weight", "model-layers-1-self_attn-q_proj-lora_B-default-weight"]
    eps = 1e-6
    for name in names:
        p = student.lora[name]
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name
        for idx in [(0, 0), (p.shape[0] - 1, p.shape[1] - 1)]:
            with torch.no_grad():
                orig = p[idx].item()
                p[idx] = orig + eps
                up, _ = distillation_loss(student, peft_model, student.lm, [seq], B, W)
                p[idx] = orig - eps
                down, _ = distillation_loss(student, peft_model, student.lm, [seq], B, W)
                p[idx] = orig
            fd = (float(up) - float(down)) / (2 * eps)
            assert p.grad[idx].item() == pytest.approx(fd, rel=1e-5, abs=1e-8), (name, idx)


def test_truncated_backprop_drops_the_gradient_through_earlier_pieces(data, fp64_norm):
    seq = data["rows"]["input_ids"][4]
    grads = []
    for truncate in (False, True):
        peft_model, student, _ = _student("h2o")
        student.truncate_backprop = truncate
        loss, _ = distillation_loss(student, peft_model, student.lm, [seq], B, W)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in student.parameters()]))
    assert torch.isfinite(grads[1]).all() and not torch.allclose(grads[0], grads[1])


def test_anchor_term_is_the_kl_of_the_adapted_full_cache_to_the_base(data, fp64_norm):
    """anchor_weight adds KL(base full || adapted full) over positions >= B + W, brute-forced here from two plain
    forwards (adapter off / on); its gradient reaches the LoRA weights (finite differences) and with a zero
    LoRA it is zero."""
    peft_model, student, _ = _student("h2o")
    seq = data["rows"]["input_ids"][3]
    first = B + W
    plain, m0 = distillation_loss(student, peft_model, student.lm, [seq], B, W)
    anchored, m1 = distillation_loss(student, peft_model, student.lm, [seq], B, W, anchor_weight=0.5)
    ids = torch.tensor([seq])
    with torch.no_grad():
        with peft_model.disable_adapter():
            base = torch.log_softmax(student.lm(ids).logits[0, first:-1].double(), -1)
        adapted = torch.log_softmax(student.lm(ids).logits[0, first:-1].double(), -1)
    want = float((base.exp() * (base - adapted)).sum(-1).mean())
    assert want > 1e-4 and m1["anchor_kl"] == pytest.approx(want, rel=1e-6)
    assert float(anchored) == pytest.approx(float(plain) + 0.5 * want, rel=1e-6)
    assert m1["kl"] == pytest.approx(m0["kl"]) and "anchor_kl" not in m0
    targets = ids[0, first + 1:]
    assert m1["ce_adapted_full"] == pytest.approx(float(-adapted.gather(-1, targets[:, None]).mean()), rel=1e-6)
    anchored.backward()
    name, idx, eps = "model-layers-1-self_attn-q_proj-lora_B-default-weight", (0, 0), 1e-6
    p = student.lora[name]
    with torch.no_grad():
        orig = p[idx].item()
        p[idx] = orig + eps
        up, _ = distillation_loss(student, peft_model, student.lm, [seq], B, W, anchor_weight=0.5)
        p[idx] = orig - eps
        down, _ = distillation_loss(student, peft_model, student.lm, [seq], B, W, anchor_weight=0.5)
        p[idx] = orig
    assert p.grad[idx].item() == pytest.approx((float(up) - float(down)) / (2 * eps), rel=1e-5, abs=1e-8)
    with torch.no_grad():
        for n, q in student.lora.items():
            if "lora_B" in n:
                q.zero_()
    _, zero = distillation_loss(student, peft_model, student.lm, [seq], B, W, anchor_weight=1.0)
    assert zero["anchor_kl"] == pytest.approx(0.0, abs=1e-7)  # the teacher's log-probs are stored in fp32


def _first_batch(cfg, task_rows) -> list[int]:
    from training.loop import StepSampler

    return StepSampler(len(task_rows), cfg.micro_batch, 1, cfg.seed).batch(0, 0)


@pytest.mark.parametrize("policy", ["h2o", "learned"])
def test_zero_initialised_lora_starts_at_the_base_models_fidelity_kl(data, tmp_path, policy):
    """peft's B = 0: the first step's KL is `eval fidelity`'s KL of the base model under the same policy."""
    from training.adapt import run_adapt
    from training.logging import read_metrics

    cfg = _cfg(data, tmp_path / "run", steps=1, micro_batch=2, policy=policy)
    run_adapt(cfg, model=foresight.load_model("tiny-llama", device="cpu")[0])
    first = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"][0]
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    rows = {t: s for t, s in zip(data["rows"]["trace_id"], data["rows"]["input_ids"])}
    train = sorted(split["train"])
    batch = [train[i] for i in _first_batch(cfg, train)]
    base, _ = foresight.load_model("tiny-llama", device="cpu")  # independent of the trainer's model
    factory = make_factory(model=base, scorer=str(data["scorer"]), interval=W)
    rec, = evaluate_fidelity(base, [rows[t] for t in batch], [policy], [B], W, trace_ids=batch, policy_factory=factory)
    assert first["positions"] == rec["tokens"]
    assert first["kl"] == pytest.approx(rec["kl"], rel=1e-5)
    assert first["loss_ratio"] == pytest.approx(rec["loss_ratio"], rel=1e-5)


def _adapter_weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def test_adapt_trains_resumes_like_an_uninterrupted_run_and_writes_a_peft_adapter(data, tmp_path):
    from peft import PeftModel

    from training.adapt import run_adapt

    fresh = lambda: foresight.load_model("tiny-llama", device="cpu")[0]  # noqa: E731 (LoRA goes into it)
    full = run_adapt(_cfg(data, tmp_path / "full", eval_before=True, eval_policies=["h2o"]), model=fresh())
    assert full["finished"] and full["skipped"] == 0 and full["adapter"] == str(tmp_path / "full" / "adapter")
    before, after = full["eval_before"], full["eval"]
    assert before["heldout_learned_vs_base_mean"] == 0.0 and before["heldout_full_ce_ratio"] == 1.0
    assert after["heldout_learned_kl_adapted"] < before["heldout_learned_kl_adapted"]  # it learned something
    assert {"heldout_h2o_loss_ratio_adapted", "heldout_h2o_vs_base_ci_low", "heldout_kl_to_base"} <= set(after)

    part = run_adapt(_cfg(data, tmp_path / "part", checkpoint_every=2, max_steps_per_run=2), model=fresh())
    assert not part["finished"] and not (tmp_path / "part" / "adapter").exists()
    resumed = run_adapt(_cfg(data, tmp_path / "part", checkpoint_every=2), resume=True, model=fresh())
    assert resumed["start"] == 2 and resumed["finished"]
    a, b = _adapter_weights(tmp_path / "full" / "adapter"), _adapter_weights(tmp_path / "part" / "adapter")
    assert a.keys() == b.keys() and any("lora_B" in k and bool(v.abs().sum() > 0) for k, v in a.items())
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-7, msg=k)

    meta = json.loads((tmp_path / "full" / "adapter" / "foresight_adapter.json").read_text())
    assert (meta["policy"], meta["budget"], meta["interval"]) == ("learned", B, W)
    assert meta["base_fingerprint"] == foresight.model_fingerprint(fresh())
    peft_model = PeftModel.from_pretrained(fresh(), str(tmp_path / "full" / "adapter"))  # peft's own loader
    merged, _ = foresight.load_model("tiny-llama", device="cpu", adapter=tmp_path / "full" / "adapter")
    ids = torch.tensor([data["rows"]["input_ids"][0]])
    torch.testing.assert_close(peft_model(input_ids=ids).logits, merged(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


def test_init_adapter_continues_from_its_weights_is_recorded_and_must_match_on_resume(data, tmp_path, monkeypatch):
    """A second training cycle from a trained adapter: its step-0 evaluation is the first run's final one (same
    weights, same held-out split), its output records the adapter it started from, and a resume with another
    starting adapter is refused (before the task takes the model); the export's model card names the adapter it
    started from."""
    import training.adapt
    from foresight.cli import main
    from foresight.errors import ForesightError
    from foresight.fingerprint import file_sha256
    from training.adapt import run_adapt

    fresh = lambda: foresight.load_model("tiny-llama", device="cpu")[0]  # noqa: E731 (LoRA goes into it)
    first = run_adapt(_cfg(data, tmp_path / "a", steps=2), model=fresh())
    other = run_adapt(_cfg(data, tmp_path / "c", steps=1), model=fresh())["adapter"]
    init = str(tmp_path / "a" / "adapter")
    part = run_adapt(_cfg(data, tmp_path / "b", steps=2, lr=5e-3, eval_before=True, init_adapter=init,
                          checkpoint_every=1, max_steps_per_run=1), model=fresh())
    for key in ("heldout_learned_loss_ratio_adapted", "heldout_learned_kl_adapted", "heldout_kl_to_base",
                "heldout_full_ce_ratio"):
        assert part["eval_before"][key] == pytest.approx(first["eval"][key], rel=1e-5, abs=1e-7), key
    assert part["eval_before"]["heldout_learned_kl_adapted"] > 0  # not a fresh (zero-B) adapter: it starts trained
    with monkeypatch.context() as m, pytest.raises(ForesightError, match="differing: init_adapter"):
        m.setattr(training.adapt, "AdaptTask", None)  # refused before the task is built
        run_adapt(_cfg(data, tmp_path / "b", steps=2, lr=5e-3, init_adapter=other, checkpoint_every=1),
                  resume=True, model=fresh())
    done = run_adapt(_cfg(data, tmp_path / "b", steps=2, lr=5e-3, init_adapter=init, checkpoint_every=1),
                     resume=True, model=fresh())
    assert done["finished"] and done["start"] == 1
    meta = json.loads((tmp_path / "b" / "adapter" / "foresight_adapter.json").read_text())
    assert meta["init_adapter"] == {"path": init, "sha256": file_sha256(Path(init) / "adapter_model.safetensors")}
    a, b = _adapter_weights(Path(init)), _adapter_weights(tmp_path / "b" / "adapter")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # it went on training
    assert main(["export", str(data["scorer"]), "--out", str(tmp_path / "export"),
                 "--adapter", str(tmp_path / "b")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"training continued from the adapter `{init}` (sha256 `{meta['init_adapter']['sha256'][:16]}" in card


def test_alternation_trains_the_adapter_on_under_a_scorer_made_for_the_adapted_model(data, tmp_path):
    """A second alternation cycle (adaptation, docs/training.md): the adapter trains on from ``init_adapter`` under a scorer trained for
    the model that adapter makes (its fingerprint carries the adapter), which is the student's first step; the run
    records that scorer. A scorer made for another adapter, or one made for an adapter without starting from it, is
    refused before training."""
    from foresight.errors import ForesightError
    from foresight.fingerprint import file_sha256
    from training.adapt import run_adapt

    fresh = lambda: foresight.load_model("tiny-llama", device="cpu")[0]  # noqa: E731 (LoRA goes into it)
    scorers = {}
    for name, steps in (("a", 2), ("c", 1)):
        run_adapt(_cfg(data, tmp_path / name, steps=steps, policy="learned"), model=fresh())
        merged, _ = foresight.load_model("tiny-llama", device="cpu", adapter=str(tmp_path / name / "adapter"))
        scorers[name] = tmp_path / f"scorer_{name}"
        Scorer(ScorerConfig(foresight.model_fingerprint(merged), budget=B, interval=W, hidden=8), seed=4) \
            .save_pretrained(scorers[name])
    init = str(tmp_path / "a" / "adapter")
    out = run_adapt(_cfg(data, tmp_path / "b", steps=1, policy="learned", init_adapter=init,
                         scorer=str(scorers["a"])), model=fresh())
    meta = json.loads((Path(out["adapter"]) / "foresight_adapter.json").read_text())
    assert meta["scorer"] == str(scorers["a"]) and meta["init_adapter"]["path"] == init
    assert meta["scorer_sha256"] == file_sha256(scorers["a"] / "model.safetensors")
    for kw in ({"init_adapter": init, "scorer": str(scorers["c"])}, {"scorer": str(scorers["a"])}):
        with pytest.raises(ForesightError, match="made with another model"):
            run_adapt(_cfg(data, tmp_path / "x", steps=1, policy="learned", **kw), model=fresh())
    assert not (tmp_path / "x" / "adapter").exists()


def test_init_adapter_of_another_shape_or_base_model_is_refused_before_training(data, tmp_path):
    from foresight.adapters import TRAINING_META, AdapterError
    from foresight.config import ConfigError
    from tests.conftest import save_random_adapter
    from training.adapt import run_adapt

    lora = save_random_adapter(tmp_path / "r4", r=4, targets=("q_proj", "v_proj"))
    with pytest.raises(ConfigError, match=r"init_adapter .*r4: has lora_r=4 \(config: 2\), lora_alpha=8 \(config: "
                                          r"16.0\), target_modules=\['q_proj', 'v_proj'\]"):
        _cfg(data, tmp_path / "x", init_adapter=str(lora))
    with pytest.raises(ConfigError, match="init_adapter: adapter .* has no adapter_config.json"):
        _cfg(data, tmp_path / "x", init_adapter=str(data["scorer"]))
    other = save_random_adapter(tmp_path / "qwen", model_name="tiny-qwen3", r=2, targets=("q_proj", "k_proj",
                                                                                         "v_proj", "o_proj"))
    with pytest.raises(AdapterError, match="made for 'tiny-qwen3', not for the model 'tiny-llama'"):
        run_adapt(_cfg(data, tmp_path / "x", init_adapter=str(other), lora_alpha=4), model=foresight.load_model(
            "tiny-llama", device="cpu")[0])
    fitted = save_random_adapter(tmp_path / "fp", r=2, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    (fitted / TRAINING_META).write_text(json.dumps({"base_fingerprint": foresight.model_fingerprint(
        foresight.load_model("tiny-qwen3", device="cpu")[0])}))
    with pytest.raises(AdapterError, match="made with another model"):
        run_adapt(_cfg(data, tmp_path / "x", init_adapter=str(fitted), lora_alpha=4), model=foresight.load_model(
            "tiny-llama", device="cpu")[0])
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("policy", ["learned", "h2o"])
def test_export_writes_the_adapter_in_peft_format_beside_the_scorer(data, tmp_path, capsys, policy):
    from peft import PeftModel

    from foresight.cli import main
    from foresight.scorer import ScorerMismatchError
    from training.adapt import run_adapt

    run_adapt(_cfg(data, tmp_path / "run", steps=2, policy=policy), model=foresight.load_model("tiny-llama")[0])
    out = tmp_path / "export"
    assert main(["export", str(data["scorer"]), "--out", str(out), "--adapter", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    assert f"trained under {policy} at B={B} W={W}" in printed
    assert sorted(p.name for p in (out / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                                  "foresight_adapter.json"]
    card = (out / "README.md").read_text()
    assert f"under policy **{policy}** at budget **B = {B}**, interval **W = {W}**" in card
    assert f"heldout_{policy}_loss_ratio_adapted" in card  # the training run's held-out numbers
    PeftModel.from_pretrained(foresight.load_model("tiny-llama")[0], str(out / "adapter"))  # peft's own loader
    adapted, _ = foresight.load_model("tiny-llama", adapter=out / "adapter")
    base, _ = foresight.load_model("tiny-llama")
    if policy == "learned":  # trained with this very scorer: the pair goes together, the base model alone does not
        assert "now records it" in printed
        Scorer.from_pretrained(out, model=adapted)
        with pytest.raises(ScorerMismatchError, match="adapter: LORA r=2 sha256 [0-9a-f]{12} vs none"):
            Scorer.from_pretrained(out, model=base)
    else:  # trained under h2o: the scorer stays the base model's, and the card says so
        assert "not trained with this scorer" in printed and "was **not** the one" in card
        Scorer.from_pretrained(out, model=base)
        with pytest.raises(ScorerMismatchError):
            Scorer.from_pretrained(out, model=adapted)


def test_the_saved_adapter_folder_gets_the_umask_mode_and_is_replaced_whole(tmp_path):
    """save_artefact made its folder with mkdtemp, so the finished adapter was 0700: other users of a shared machine
    could not read it. It gets the mode mkdir gives (the umask's); a failed save leaves the earlier adapter whole."""
    import stat
    from types import SimpleNamespace

    from foresight.tiny_models import build_tiny_model
    from tests.policies.test_scorer import _tree
    from training.adapt import AdaptTask

    task = SimpleNamespace(peft_model=seeded_lora(build_tiny_model("tiny-llama")[0]),
                           training_meta=lambda: {"policy": "h2o"})
    path = tmp_path / "run" / "adapter"
    umask = os.umask(0o022)
    try:
        (tmp_path / "ref").mkdir()
        assert stat.S_IMODE((tmp_path / "ref").stat().st_mode) == 0o755
        assert AdaptTask.save_artefact(task, path) == path
        assert stat.S_IMODE(path.stat().st_mode) == 0o755
        os.umask(0o027)
        AdaptTask.save_artefact(task, path)  # replaced: the new folder's mode is the umask's now
        assert stat.S_IMODE(path.stat().st_mode) == 0o750
    finally:
        os.umask(umask)
    assert {"adapter_config.json", "adapter_model.safetensors", "foresight_adapter.json"} <= {p.name for p in
                                                                                            path.iterdir()}
    before = _tree(path)
    task.training_meta = lambda: 1 / 0  # an error before the folder is complete
    with pytest.raises(ZeroDivisionError):
        AdaptTask.save_artefact(task, path)
    assert _tree(path) == before and [p.name for p in path.parent.iterdir()] == ["adapter"]


def test_adapt_evaluates_on_a_separate_heldout_split_and_refuses_shared_problems(data, tmp_path):
    from foresight.config import ConfigError
    from foresight.errors import ForesightError
    from training.adapt import run_adapt

    model = foresight.load_model("tiny-llama", device="cpu")[0]
    save_random_traces(model, tmp_path / "held", [44, 12, 50], seed=5, prompt_len=8, prefix="q")  # q1: <= B + W
    out = run_adapt(_cfg(data, tmp_path / "run", steps=1, heldout_traces=str(tmp_path / "held")), model=model)
    assert out["eval"]["heldout_traces"] == 2  # q0 and q2; every trace of `traces` trained
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    assert len(split["train"]) == len(LENGTHS), split
    with pytest.raises(ForesightError, match="also occur in"):  # the training traces themselves: in-sample
        run_adapt(_cfg(data, tmp_path / "bad", steps=1, heldout_traces=str(data["traces"])),
                  model=foresight.load_model("tiny-llama", device="cpu")[0])
    with pytest.raises(ConfigError, match="heldout_traces"):
        _cfg(data, tmp_path / "x", heldout_traces=str(tmp_path / "missing"))


def test_adapt_config_is_validated_before_any_work(data, tmp_path):
    from foresight.errors import ForesightError
    from tests.conftest import save_random_adapter

    lora = save_random_adapter(tmp_path / "lora")
    other_bw = tmp_path / "scorer_2b"  # for eval_policies: refused only after the whole training
    Scorer(ScorerConfig(foresight.model_fingerprint(foresight.load_model("tiny-llama", device="cpu")[0]),
                        budget=2 * B, interval=W, hidden=8), seed=0).save_pretrained(other_bw)

    for kw, match in [({"sinks": B - W + 1}, "budget/interval/sinks"),  # after the model load, split.json written
                      ({"policy": "h2o", "eval_policies": ["learned"], "scorer": str(other_bw)},
                       "eval_policies: learned: "),
                      ({"policy": "full"}, "never evicts"), ({"policy": "golden"}, "decode time"),
                      ({"policy": "h2oo"}, "h2oo"), ({"scorer": None}, "needs `scorer`"),
                      ({"scorer": str(tmp_path)}, "config.json"), ({"lora_r": 0}, "lora_r"),
                      ({"policy": "h2o", "policy_kwargs": {"nope": 1}}, "nope"),
                      ({"adapter": str(data["scorer"])}, "no adapter_config.json"),
                      ({"adapter": str(lora)}, "set `init_adapter` to it"), ({"interval": 16}, "interval"),
                      ({"eval_policies": ["golden"]}, "golden"), ({"target_modules": []}, "target_modules")]:
        with pytest.raises((ForesightError, ValueError), match=match):
            _cfg(data, tmp_path / "x", **kw)
    assert not (tmp_path / "x").exists()


def test_configs_adapt_yaml_documents_every_key():
    import yaml

    from training.adapt_config import AdaptConfig

    assert set(yaml.safe_load((REPO / "configs" / "adapt.yaml").read_text())) == set(AdaptConfig.keys())


def test_cli_trains_adapt_and_refuses_bad_keys(data, tmp_path, capsys):
    from foresight.cli import main

    assert main(["train", "adapt", "--config", str(REPO / "configs" / "adapt.yaml"), "model=tiny-llama",
                 f"traces={data['traces']}", f"scorer={data['scorer']}", "policy=lazy", "eval_policies=[learned]",
                 f"budget={B}", f"interval={W}", "heldout=2", "steps=2", "lora_r=2", "checkpoint_every=0", "device=cpu",
                 f"deepspeed={DS}", f"out_dir={tmp_path / 'cli'}"]) == 0
    assert "heldout_lazy_loss_ratio_adapted" in capsys.readouterr().out
    assert (tmp_path / "cli" / "adapter" / "adapter_model.safetensors").is_file()
    assert main(["train", "adapt", f"traces={data['traces']}", "policy=full", f"deepspeed={DS}"]) == 2
    assert "never evicts" in capsys.readouterr().err


@pytest.mark.slow
def test_two_rank_cpu_deepspeed_adapt_resume_equals_uninterrupted(data, tmp_path):
    """`torchrun --nproc_per_node 2 -m foresight train adapt` on CPU: 2 steps straight, and 1 step + --resume."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))

    def launch(out: Path, *extra: str):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29763",
               "-m", "foresight", "train", "adapt", "--config", str(REPO / "configs" / "adapt.yaml"),
               "model=tiny-llama", f"traces={data['traces']}", f"scorer={data['scorer']}", f"budget={B}",
               f"interval={W}", "heldout=2", "steps=2", "lr=0.01", "warmup_steps=0", "lora_r=2", "checkpoint_every=1",
               "eval_before=false", "eval_traces=1", f"out_dir={out}", "device=cpu", f"deepspeed={DS}", *extra]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    launch(tmp_path / "full")
    launch(tmp_path / "part", "max_steps_per_run=1")
    assert (tmp_path / "part" / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert "resumed from step 1" in launch(tmp_path / "part", "--resume").stdout
    summary = json.loads((tmp_path / "part" / "summary.json").read_text())
    assert summary["finished"] and summary["start"] == 1 and summary["skipped"] == 0
    a, b = _adapter_weights(tmp_path / "full" / "adapter"), _adapter_weights(tmp_path / "part" / "adapter")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-7, msg=k)


def test_adapt_eval_script_reproduces_the_trainers_heldout_evaluation_and_refuses_mismatches(data, tmp_path, capsys):
    """benchmarks/adapt_eval.py (the SmolLM2 measurement) runs the trainer's own comparison on a saved adapter: the
    same numbers as the trainer's final held-out evaluation; a scorer the adapter was not trained under, or a
    non-evicting policy, is one line and exit 2 before any replay."""
    from training.adapt import run_adapt

    model = foresight.load_model("tiny-llama", device="cpu")[0]
    save_random_traces(model, tmp_path / "held", [44, 50], seed=5, prompt_len=8, prefix="q")
    out = run_adapt(_cfg(data, tmp_path / "run", steps=3, policy="learned", eval_policies=["h2o"],
                         heldout_traces=str(tmp_path / "held")), model=model)
    mod = load_script("adapt_eval.py")
    args = ["--model", "tiny-llama", "--adapter", str(tmp_path / "run" / "adapter"), "--traces",
            str(tmp_path / "held"), "--policies", "learned,h2o", "--scorer", str(data["scorer"]), "--budget", str(B),
            "--interval", str(W), "--batch-size", "1", "--out", str(tmp_path / "eval")]
    assert mod.main(args) == 0
    got = json.loads((tmp_path / "eval" / "adapt_eval.json").read_text())["metrics"]
    ev = out["eval"]
    assert ev["heldout_learned_loss_ratio_adapted"] != ev["heldout_learned_loss_ratio_base"]  # it trained
    for key, value in got.items():
        assert value == pytest.approx(ev[f"heldout_{key}"], rel=1e-5, abs=1e-7), key
    assert "| learned |" in (tmp_path / "eval" / "adapt_eval.md").read_text()

    other = tmp_path / "other_scorer"
    Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8), seed=1) \
        .save_pretrained(other)
    for bad, match in ((["--scorer", str(other)], "not the scorer the adapter was trained under"),
                       (["--policies", "full,h2o"], "does not evict")):
        argv = [*args, *bad, "--out", str(tmp_path / "bad")]
        with pytest.raises(SystemExit) as exc:
            mod.run_script(lambda: mod.main(argv), "adapt_eval")
        assert exc.value.code == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before writing anything


@pytest.mark.parametrize("flag,value", [("--max-traces", "-1"), ("--batch-size", "0"), ("--sinks", "-2")])
def test_adapt_eval_refuses_bad_numbers_when_parsing(flag, value, capsys):
    """``--max-traces -1`` used to drop the last trace silently (``rows[:-1]``) and ``--batch-size 0`` ended in a
    traceback after both models' replays had been set up: argparse refuses them, exit 2, naming the flag."""
    mod = load_script("adapt_eval.py")
    with pytest.raises(SystemExit) as exc:
        mod.parse_args(["--adapter", "a", "--traces", "t", "--policies", "h2o", "--budget", "16", "--interval", "4",
                        "--out", "o", flag, value])
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_adapt_eval_with_a_scorer_trained_for_the_adapted_model_is_system_against_system(data, tmp_path, capsys):
    """--adapted-scorer (adaptation, docs/training.md, scorer alternated with the adapter): the adapted side evicts with a scorer whose
    fingerprint carries the adapter, and its record equals `eval fidelity` of the merged adapted model with that
    scorer, computed independently; the base side is untouched. A scorer of the base model, or the option without
    `learned`, is one line and exit 2 before anything is written."""
    from training.adapt import run_adapt

    model = foresight.load_model("tiny-llama", device="cpu")[0]
    held = save_random_traces(model, tmp_path / "held", [44, 50], seed=5, prompt_len=8, prefix="q")
    run_adapt(_cfg(data, tmp_path / "run", steps=3, policy="learned", heldout_traces=str(tmp_path / "held")),
              model=model)
    adapter = tmp_path / "run" / "adapter"
    merged, _ = foresight.load_model("tiny-llama", device="cpu", adapter=str(adapter))
    own = tmp_path / "own_scorer"
    Scorer(ScorerConfig(foresight.model_fingerprint(merged), budget=B, interval=W, hidden=8), seed=2) \
        .save_pretrained(own)
    mod = load_script("adapt_eval.py")
    args = ["--model", "tiny-llama", "--adapter", str(adapter), "--traces", str(tmp_path / "held"),
            "--policies", "learned", "--scorer", str(data["scorer"]), "--budget", str(B), "--interval", str(W),
            "--batch-size", "1"]
    assert mod.main([*args, "--out", str(tmp_path / "same")]) == 0
    assert mod.main([*args, "--adapted-scorer", str(own), "--out", str(tmp_path / "own")]) == 0
    same = json.loads((tmp_path / "same" / "adapt_eval.json").read_text())
    got = json.loads((tmp_path / "own" / "adapt_eval.json").read_text())
    assert got["meta"]["adapted_scorer"] == str(own) and got["meta"]["adapted_scorer_sha256"]
    assert got["base"] == same["base"]  # the base model still evicts with --scorer
    ids, seqs = list(held["trace_id"]), [list(map(int, x)) for x in held["input_ids"]]
    rec, = evaluate_fidelity(merged, seqs, ["learned"], [B], W, trace_ids=ids,
                             policy_factory=make_factory(model=merged, scorer=str(own), interval=W))
    adapted, = got["adapted"]
    assert adapted["loss_ratio"] == pytest.approx(rec["loss_ratio"], rel=1e-4)
    assert adapted["loss_ratio"] != pytest.approx(same["adapted"][0]["loss_ratio"], rel=1e-6)  # another scorer
    assert "its own scorer" in (tmp_path / "own" / "adapt_eval.md").read_text()
    other_bw = tmp_path / "own_other_bw"  # refused only after the whole base-side replay, before
    Scorer(ScorerConfig(foresight.model_fingerprint(merged), budget=2 * B, interval=W, hidden=8), seed=2) \
        .save_pretrained(other_bw)
    sampled = tmp_path / "own_sampled"  # its recorded default selection is sample, the base scorer's top-k
    Scorer(ScorerConfig(foresight.model_fingerprint(merged), budget=B, interval=W, hidden=8, temperature=0.05,
                        selection="sample"), seed=2).save_pretrained(sampled)
    for bad, match in ((["--adapted-scorer", str(data["scorer"])], "made with another model"),
                       (["--adapted-scorer", str(own), "--policies", "h2o"], "only the learned policy"),
                       (["--adapted-scorer", str(other_bw)], f"--adapted-scorer {other_bw}: "),
                       (["--adapted-scorer", str(sampled)], f"different default selections (--scorer {data['scorer']}: "
                                                            f"topk, --adapted-scorer {sampled}: sample)"),
                       (["--policy-arg", f"learned.scorer={own}"], "--policy-arg learned.scorer")):  # a TypeError
        argv = [*args, *bad, "--out", str(tmp_path / "bad")]
        with pytest.raises(SystemExit) as exc:
            mod.run_script(lambda: mod.main(argv), "adapt_eval")
        assert exc.value.code == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_adapt_runs_script_pairs_two_real_runs_by_step_and_refuses_another_data_order(data, tmp_path, capsys):
    """benchmarks/adapt_runs.py on two real runs that differ only in learning rate: every logged window's teacher
    CE agrees (same traces), the losses differ from step 2 on; a run with another seed is refused."""
    from training.adapt import run_adapt

    mod = load_script("adapt_runs.py")
    for name, kw in (("fast", {}), ("slow", {"lr": 1e-3}), ("seed1", {"seed": 1})):
        model = foresight.load_model("tiny-llama", device="cpu")[0]  # adapt refuses a model with LoRA layers
        run_adapt(_cfg(data, tmp_path / name, steps=3, policy="h2o", **kw), model=model)
    res = mod.compare(tmp_path / "fast", tmp_path / "slow")
    assert res["windows"] == 3 and res["values_a"][0] == pytest.approx(res["values_b"][0], rel=1e-5)
    assert res["values_a"][2] != pytest.approx(res["values_b"][2], rel=1e-4)  # the learning rates differ
    with pytest.raises(SystemExit) as exc:
        mod.run_script(lambda: mod.main([str(tmp_path / "fast"), str(tmp_path / "seed1")]), "adapt_runs")
    assert exc.value.code == 2 and "setting 'seed' differs" in capsys.readouterr().err


def test_compare_adapted_refuses_records_of_different_traces():
    """Two trace sets were paired on their intersection while their pooled ratios came from all of each."""
    from evaluation.adapted import compare_adapted

    def rec(ids):
        return {"h2o": {"loss_ratio": 1.2, "kl": 0.1, "ce_full": 0.6, "per_trace_ratio": {i: 1.2 for i in ids}}}

    same = compare_adapted(rec(["a", "b", "c"]), rec(["c", "b", "a"]))
    assert same["h2o_vs_base_mean"] == 0.0
    with pytest.raises(ValueError, match="different traces .3 vs 2, 1 on one side only"):
        compare_adapted(rec(["a", "b", "c"]), rec(["a", "b"]))
