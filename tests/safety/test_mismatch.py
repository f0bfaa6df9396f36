"""No silent wrong results: labels tied to their traces' tokens, one model check, finite scorers, safe export.

Each test feeds a mismatched or broken artefact that used to run with exit status 0 and a plausible number, and
expects a one-line :class:`ForesightError` (exit 2 on the command line) naming the file and what differs.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch

import foresight
from foresight.cli import main
from foresight.errors import ForesightError
from foresight.fingerprint import ModelMismatchError, check_same_model, fingerprint_diff
from foresight.outputs import MARKER
from tests.conftest import get_model

B, W = 16, 4
REPO = Path(__file__).resolve().parents[2]


def _traces(path: Path, model_name: str = "tiny-llama", seed: int = 0, n: int = 4) -> Path:
    """``n`` random-token traces (40-58 tokens, one problem each) whose fingerprint is ``model_name``'s."""
    import datasets

    model, _ = get_model(model_name)
    fp = json.dumps(foresight.model_fingerprint(model))
    g = torch.Generator().manual_seed(seed)
    rows = [dict(trace_id=f"p{i}#0", problem_id=f"p{i}", sample=0, prompt_len=4, answer="", settings="{}",
                 fingerprint=fp, input_ids=torch.randint(3, 250, (40 + 6 * i,), generator=g).tolist())
            for i in range(n)]
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Traces, a second trace set with the same ids but other tokens, and golden labels of the first."""
    from golden.pipeline import label_traces

    root = tmp_path_factory.mktemp("mismatch")
    model, _ = get_model("tiny-llama")
    traces = _traces(root / "traces", seed=0)
    other = _traces(root / "other_tokens", seed=1)  # same trace ids and lengths, other tokens
    label_traces(model, traces, root / "golden", B, W, progress=False)
    return {"root": root, "traces": traces, "other": other, "golden": root / "golden"}


# ---- the one fingerprint check ----------------------------------------------------------------------------------


def test_check_same_model_rule():
    llama, qwen3 = get_model("tiny-llama")[0], get_model("tiny-qwen3")[0]
    fp = foresight.model_fingerprint(llama)
    check_same_model(fp, llama, "x")
    check_same_model(json.dumps(fp), fp, "x")  # JSON as stored in trace datasets
    check_same_model(dict(fp, model="/models/cache/copy"), fp, "x")  # the name a loader gave it is not identity
    with pytest.raises(ModelMismatchError, match="model_type: 'llama' vs 'qwen3'"):
        check_same_model(fp, qwen3, "scorer s")  # same shapes, other architecture
    with pytest.raises(ModelMismatchError, match="vocab_size: None vs 261"):
        check_same_model({k: v for k, v in fp.items() if k != "vocab_size"}, fp, "x")  # never assumed equal
    with pytest.raises(ModelMismatchError, match=r"rope: \{'rope_theta': 10000.0, 'rope_type': 'default'\} vs "):
        check_same_model(fp, dict(fp, rope={"rope_theta": 500000.0, "rope_type": "default"}), "x")
    assert fingerprint_diff(fp, fp) == []


def test_one_changed_weight_is_another_model_whatever_its_name():
    from foresight.tiny_models import build_tiny_model

    llama = get_model("tiny-llama")[0]
    copy = build_tiny_model("tiny-llama")[0]  # the same numbers, built again
    copy.config._name_or_path = "/somewhere/else/finetune"
    check_same_model(llama, copy, "x")
    with torch.no_grad():
        copy.model.layers[1].mlp.up_proj.weight[3, 5] += 0.25
    with pytest.raises(ModelMismatchError) as err:
        check_same_model(llama, copy, "scorer s")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("scorer s: made with another model") and "weights (float32 SHA-256)" in msg
    # the same weights in bf16 / fp16 (what a GPU loads) are the same model, compared at the coarser precision
    fp = foresight.model_fingerprint(llama)
    half = build_tiny_model("tiny-llama")[0].to(torch.bfloat16)
    check_same_model(fp, half, "x")
    assert set(foresight.model_fingerprint(half)["weights"]) == {"bfloat16"}
    check_same_model(fp, build_tiny_model("tiny-llama")[0].to(torch.float64), "x")  # numerical checks run in fp64
    with pytest.raises(ModelMismatchError, match="weights: digested in bfloat16 vs float16, not comparable"):
        check_same_model(half, build_tiny_model("tiny-llama")[0].to(torch.float16), "x")


def test_an_older_fingerprint_without_weights_is_compared_by_name_with_a_warning():
    import foresight.fingerprint as fingerprint

    fp = foresight.model_fingerprint(get_model("tiny-llama")[0])
    old = {k: v for k, v in fp.items() if k not in ("weights", "rope")}
    fingerprint._WARNED.clear()
    with pytest.warns(UserWarning, match="'tiny-llama' records no weights digest.*matched by model name only"):
        check_same_model(dict(old, model="/cache/tiny-llama"), fp, "x")
    with pytest.raises(ModelMismatchError, match="model: 'tiny-llama' vs 'finetune'"):
        check_same_model(old, dict(fp, model="finetune"), "labels l")


# ---- labels tied to the tokens they were computed from -----------------------------------------------------------


def test_labels_record_token_hash(data):
    from datasets import load_from_disk

    from golden.labels import load_labels, token_hash

    labels = load_labels(data["golden"])
    for row in load_from_disk(str(data["traces"])):
        lab = labels[row["trace_id"]]
        assert lab.token_hash == token_hash(row["input_ids"]) == token_hash(torch.tensor([row["input_ids"]]))
        assert lab.source and data["golden"] in Path(lab.source).parents


def test_labels_of_other_tokens_are_refused_everywhere(data, tmp_path, capsys):
    from datasets import load_from_disk

    from foresight.policies import make_policy
    from golden.labels import LabelMismatchError, check_label_tokens, load_labels

    model, _ = get_model("tiny-llama")
    labels = load_labels(data["golden"])
    other = load_from_disk(str(data["other"]))
    with pytest.raises(LabelMismatchError, match=r"labels-00000\.safetensors of trace 'p0#0'.*other token ids"):
        check_label_tokens(labels, [(other[0]["trace_id"], other[0]["input_ids"])])
    # the golden policy checks at every replay (the runtime hands it the rows' tokens)
    with pytest.raises(LabelMismatchError, match="p0#0"):
        foresight.replay(model, [other[0]["input_ids"]], make_policy("golden", labels=data["golden"]), B, W,
                         trace_ids=["p0#0"])
    # eval fidelity --golden: exit 2 before any replay, naming the labels file and the trace
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(data["other"]), "--policies",
               "golden,full", "--budget", str(B), "--interval", str(W), "--golden", str(data["golden"]),
               "--out", str(tmp_path / "fid"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "labels-0000" in err and "p0#0" in err and "other token ids" in err
    assert not (tmp_path / "fid" / "fidelity.json").exists()
    # train sl: refused before any feature is extracted
    from training.sl import run_sl
    from training.sl_config import SLConfig

    cfg = SLConfig.from_dict(dict(
        model="tiny-llama", traces=str(data["other"]), labels=str(data["golden"]), budget=B, interval=W, heldout=1,
        steps=2, checkpoint_every=0, eval_every=0, eval_fidelity=False, out_dir=str(tmp_path / "sl"),
        feature_cache=str(tmp_path / "features"), device="cpu",
        deepspeed=str(REPO / "configs" / "deepspeed" / "zero0.json")))
    with pytest.raises(LabelMismatchError, match="other token ids"):
        run_sl(cfg, model=model)
    assert not (tmp_path / "sl" / "scorer").exists()


def test_golden_resumed_with_other_traces_of_the_same_ids_is_refused(data, tmp_path, capsys):
    """A finished shard is skipped only when it labels these very traces: rerunning `foresight golden` into a
    directory made from other traces with the same ids used to report every shard finished (exit 0)."""
    import shutil

    out = tmp_path / "golden"
    shutil.copytree(data["golden"], out)
    before = {f: f.read_bytes() for f in out.rglob("*") if f.is_file()}
    argv = ["golden", "--model", "tiny-llama", "--out", str(out), "--budget", str(B), "--interval", str(W),
            "--no-progress"]
    assert main([*argv, "--traces", str(data["other"])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'p0#0'" in err and str(data["other"]) in err and "other token ids" in err
    assert {f: f.read_bytes() for f in out.rglob("*") if f.is_file()} == before
    assert main([*argv, "--traces", str(data["traces"])]) == 0  # the traces it was made from still resume
    assert "0 labelled now" in capsys.readouterr().out


def test_old_labels_without_hashes_are_refused(data, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from golden.labels import LabelMismatchError, load_labels

    src = next(data["golden"].rglob("labels-00000.safetensors"))
    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta["format"] = "foresight-golden-labels/1"
    del meta["token_hashes"]
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=meta)
    with pytest.raises(LabelMismatchError, match=r"old\.safetensors.*without token hashes.*regenerate"):
        load_labels(tmp_path / "old.safetensors")
    # rerunning `foresight golden` into a directory of the old format does not resume it (no mixed formats)
    import shutil

    from golden.pipeline import label_traces

    shutil.copytree(data["golden"], tmp_path / "g")
    plan = json.loads((tmp_path / "g" / "plan.json").read_text())
    (tmp_path / "g" / "plan.json").write_text(json.dumps(dict(plan, version=1)))
    with pytest.raises(ForesightError, match=r"different version \(1 there, 2 now\)"):
        label_traces(get_model("tiny-llama")[0], data["traces"], tmp_path / "g", B, W, progress=False)


def test_golden_labels_of_another_budget_are_an_error(data, tmp_path, capsys):
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(data["traces"]), "--policies",
               "golden,full", "--budget", "20", "--interval", str(W), "--golden", str(data["golden"]),
               "--out", str(tmp_path / "fid"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and f"B={B} W={W}" in err and f"not B=20 W={W}" in err
    assert not (tmp_path / "fid").exists()  # refused before any output


# ---- scorers and traces of another model -------------------------------------------------------------------------


@pytest.fixture
def llama_scorer(tmp_path):
    from foresight.scorer import Scorer, ScorerConfig

    model, _ = get_model("tiny-llama")
    sc = Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8), seed=0)
    return sc.save_pretrained(tmp_path / "scorer")


def test_generate_refuses_a_scorer_of_another_model(llama_scorer, capsys):
    args = ["generate", "--model", "tiny-qwen3", "--prompt", "hello", "--policy", "learned", "--policy-arg",
            f"scorer={llama_scorer}", "--budget", str(B), "--interval", str(W), "--max-new-tokens", "30"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "another model" in err and "model_type: 'llama' vs 'qwen3'" in err and str(llama_scorer) in err
    assert len(err.splitlines()) == 1
    assert main([*args[:2], "tiny-llama", *args[3:]]) == 0  # the right model runs


@pytest.mark.parametrize("budget, interval", [(2 * B, W), (B, W // 2)])
def test_a_scorer_of_another_budget_or_interval_is_refused(llama_scorer, budget, interval, capsys):
    """A scorer's features (its recent-query window is its W) and ranking belong to its (B, W): another cache
    setting is an error, unless the user asks for a transfer experiment with any_budget=true."""
    args = ["generate", "--model", "tiny-llama", "--prompt", "hello", "--policy", "learned", "--policy-arg",
            f"scorer={llama_scorer}", "--budget", str(budget), "--interval", str(interval), "--max-new-tokens", "30"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert f"is for B={B} W={W}, not B={budget} W={interval}" in err and len(err.splitlines()) == 1
    assert main([*args, "--policy-arg", "any_budget=true"]) == 0


def test_eval_fidelity_refuses_a_scorer_of_another_budget_before_any_output(llama_scorer, data, tmp_path, capsys):
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(data["traces"]), "--policies",
               "full,learned", "--scorer", str(llama_scorer), "--budget", str(2 * B), "--interval", str(W),
               "--out", str(tmp_path / "fid"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"policy 'learned': scorer {llama_scorer} is for B={B} W={W}, not B={2 * B} W={W}" in err
    assert not (tmp_path / "fid").exists()
    # the right budget runs, and records which weights it measured (a short name may later point at others)
    assert main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(data["traces"]), "--policies",
                 "learned", "--scorer", str(llama_scorer), "--budget", str(B), "--interval", str(W),
                 "--out", str(tmp_path / "fid"), "--quiet"]) == 0
    settings = json.loads((tmp_path / "fid" / "settings.json").read_text())
    assert settings["scorer_sha256"] == hashlib.sha256((llama_scorer / "model.safetensors").read_bytes()).hexdigest()


def test_grpo_refuses_traces_of_another_model(llama_scorer, tmp_path):
    from training.grpo import GRPOConfig, run_grpo

    traces = _traces(tmp_path / "qwen3_traces", model_name="tiny-qwen3")
    cfg = GRPOConfig.from_dict(dict(
        model="tiny-llama", traces=str(traces), init_scorer=str(llama_scorer), out_dir=str(tmp_path / "grpo"),
        steps=1, group_size=2, heldout=1, checkpoint_every=0, device="cpu",
        deepspeed=str(REPO / "configs" / "deepspeed" / "zero0.json")))
    with pytest.raises(ModelMismatchError, match=r"qwen3_traces.*another model"):
        run_grpo(cfg, model=get_model("tiny-llama")[0])


# ---- non-finite scorers ------------------------------------------------------------------------------------------


def _poison(scorer_dir: Path, name: str, value: float) -> None:
    from safetensors.torch import load_file, save_file

    path = scorer_dir / "model.safetensors"
    state = load_file(str(path))
    state[name].view(-1)[3] = value
    save_file(state, str(path))


@pytest.mark.parametrize("name, value", [("w1", float("nan")), ("feature_std", float("inf"))])
def test_scorer_with_nan_or_inf_is_refused(llama_scorer, tmp_path, capsys, name, value):
    from foresight.scorer import Scorer

    _poison(llama_scorer, name, value)
    with pytest.raises(ForesightError, match=rf"model\.safetensors: tensor '{name}' holds 1 NaN/Inf"):
        Scorer.from_pretrained(llama_scorer)
    assert main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--policy", "learned", "--policy-arg",
                 f"scorer={llama_scorer}", "--budget", str(B), "--interval", str(W)]) == 2
    assert "NaN/Inf" in capsys.readouterr().err
    out = tmp_path / "export"
    assert main(["export", str(llama_scorer), "--out", str(out), "--onnx"]) == 2
    assert "NaN/Inf" in capsys.readouterr().err and not out.exists()


def test_learned_policy_never_ranks_nan_scores(llama_scorer):
    from foresight.policies import make_policy
    from foresight.scorer import Scorer

    model, tok = get_model("tiny-llama")
    sc = Scorer.from_pretrained(llama_scorer)
    with torch.no_grad():
        sc.b2[1, 0] = float("nan")  # in memory, past the loader's check: one layer, one head
    with pytest.raises(ForesightError, match="NaN/Inf scores at event 0, layer 1"):
        foresight.generate(model, tok, ["hello"], policy=make_policy("learned", scorer=sc), budget=B, interval=W,
                           max_new_tokens=40)


def test_onnx_check_does_not_verify_nan_against_nan(llama_scorer, tmp_path):
    from evaluation.onnx_export import export_onnx
    from foresight.scorer import Scorer

    sc = Scorer.from_pretrained(llama_scorer)
    with torch.no_grad():
        sc.w2.fill_(float("nan"))
    with pytest.raises(ForesightError, match="NaN/Inf scores on random inputs"):
        export_onnx(sc, tmp_path / "s.onnx")


# ---- export: no overwrite without asking, never a mix of two exports ---------------------------------------------


def test_export_refuses_to_overwrite_and_replaces_atomically(llama_scorer, tmp_path, capsys, monkeypatch):
    import evaluation.export as export
    from foresight.fingerprint import file_sha256

    out = tmp_path / "export"
    (tmp_path / "results").mkdir()
    fid = tmp_path / "results" / "fidelity.json"  # not beside the scorer, where the export would find it itself
    sha = file_sha256(llama_scorer / "model.safetensors")  # the record names the weights it measured
    fid.write_text(json.dumps([{"policy": "learned", "budget": B, "loss_ratio": 1.01, "scorer_sha256": sha}]))
    assert main(["export", str(llama_scorer), "--out", str(out), "--onnx", "--fidelity", str(fid)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"scorer.onnx", "fidelity.json", "model.safetensors", "README.md"} <= set(before)

    assert main(["export", str(llama_scorer), "--out", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched

    def boom(*a, **k):
        raise ForesightError("ONNX failed")

    monkeypatch.setattr(export, "export_onnx", boom)
    assert main(["export", str(llama_scorer), "--out", str(out), "--onnx", "--overwrite"]) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # a failed export leaves the old one whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [".export.lock", "export", "results", "scorer"]  # no temp

    assert main(["export", str(llama_scorer), "--out", str(out), "--overwrite"]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {MARKER, "config.json", "model.safetensors", "README.md"}  # nothing of the earlier export beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == [".export.lock", "export", "results", "scorer"]
    assert main(["export", str(tmp_path), "--out", str(tmp_path), "--overwrite"]) == 2  # would delete the source
    assert "holds the source scorer" in capsys.readouterr().err


# ---- scorer checkpoints are never unpickled ----------------------------------------------------------------------


class _Exploit:
    def __reduce__(self):
        return (Path.touch, (Path(_Exploit.marker),))


def test_scorer_loading_never_unpickles(llama_scorer, tmp_path):
    from foresight.scorer import Scorer

    _Exploit.marker = str(tmp_path / "pwned")
    (llama_scorer / "model.safetensors").write_bytes(pickle.dumps({"w1": _Exploit()}))
    with pytest.raises(ForesightError, match=r"model\.safetensors is not a readable safetensors file"):
        Scorer.from_pretrained(llama_scorer)
    (llama_scorer / "model.safetensors").unlink()
    torch.save({"w1": _Exploit()}, llama_scorer / "pytorch_model.bin")  # a pickle checkpoint is not even looked at
    with pytest.raises(ForesightError, match="not a scorer directory"):
        Scorer.from_pretrained(llama_scorer)
    assert not (tmp_path / "pwned").exists()


def test_a_saved_copy_with_one_changed_weight_is_refused_by_a_scorer_in_one_line(tmp_path, capsys):
    """The copy loads from a directory (another name than the scorer records): the same weights run, one changed
    weight is refused before generating, naming the weights."""
    from foresight.tiny_models import build_tiny_model
    from foresight.scorer import Scorer, ScorerConfig

    llama = get_model("tiny-llama")[0]
    Scorer(ScorerConfig(foresight.model_fingerprint(llama), B, W)).save_pretrained(tmp_path / "scorer")
    model, tok = build_tiny_model("tiny-llama")
    model.save_pretrained(tmp_path / "same")
    tok.save_pretrained(tmp_path / "same")
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[0, 0] += 0.5
    model.save_pretrained(tmp_path / "changed")
    tok.save_pretrained(tmp_path / "changed")
    argv = ["generate", "--prompt", "hello", "--policy", "learned", "--policy-arg", f"scorer={tmp_path / 'scorer'}",
            "--budget", str(B), "--interval", str(W), "--max-new-tokens", "30", "--json"]
    assert main([*argv[:1], "--model", str(tmp_path / "same"), *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["stats"]["evictions"] >= 1, out
    assert main([*argv[:1], "--model", str(tmp_path / "changed"), *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("foresight generate: error: scorer ") and "weights (float32 SHA-256)" in err
