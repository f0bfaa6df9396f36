"""``foresight export``: round trip of the checkpoint, ONNX parity, model card, and use of the export."""

from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from foresight.cli import main


@pytest.fixture
def scorer_dir(tmp_path, tiny_llama):
    """A scorer with non-trivial weights and normaliser, saved as a training run would (``<run>/scorer``)."""
    from foresight.fingerprint import file_sha256
    from foresight.models import model_fingerprint
    from foresight.scorer import Scorer, ScorerConfig

    model, _ = tiny_llama
    cfg = ScorerConfig(fingerprint=model_fingerprint(model), budget=32, interval=8,
                       provenance={"trainer": "sl", "steps": 3})
    scorer = Scorer(cfg, seed=5)
    with torch.no_grad():
        scorer.b2.normal_()
        scorer.feature_mean.normal_()
        scorer.feature_std.uniform_(0.5, 2.0)
    run = tmp_path / "run"
    scorer.save_pretrained(run / "scorer")
    sha = file_sha256(run / "scorer" / "model.safetensors")  # the record names the weights it measured
    fid = [{"policy": "learned", "budget": 32, "interval": 8, "loss_ratio": 1.0123, "delta_ce": 0.01, "kl": 0.02,
            "top1_agreement": 0.97, "tokens": 500, "scorer_sha256": sha},
           {"policy": "random", "budget": 32, "interval": 8, "loss_ratio": 1.2345, "delta_ce": 0.2, "kl": 0.3,
            "top1_agreement": 0.8, "tokens": 500}]
    (run / "fidelity.json").write_text(json.dumps(fid))
    return run


def _features(cfg, gen, batch=2, n=11):
    return torch.randn(cfg.num_layers, batch, cfg.num_kv_heads, n, cfg.input_dim, generator=gen) * 3


def test_round_trip(scorer_dir, tmp_path, capsys):
    from foresight.fingerprint import file_sha256
    from foresight.scorer import Scorer

    # weights as an older version wrote them (two metadata keys): the export must keep those very bytes
    src = scorer_dir / "scorer" / "model.safetensors"
    save_file(load_file(src), str(src), metadata={"type": "foresight-scorer", "format": "pt"})
    fid = json.loads((scorer_dir / "fidelity.json").read_text())  # other bytes: the evaluation names them
    fid[0]["scorer_sha256"] = file_sha256(src)
    (scorer_dir / "fidelity.json").write_text(json.dumps(fid))
    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "README.md"}
    assert (out / "model.safetensors").read_bytes() == src.read_bytes()  # same SHA-256 as trained
    orig = Scorer.from_pretrained(scorer_dir / "scorer")
    exp = Scorer.from_pretrained(out)
    x = _features(orig.config, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(orig(x), exp(x))
        assert torch.equal(orig(x[1], layer_idx=1), exp(x[1], layer_idx=1))
    assert exp.config.budget == 32 and exp.config.interval == 8
    prov = exp.config.provenance
    assert prov["trainer"] == "sl" and "exported_at" in prov and prov["exported_from"].endswith("scorer")
    card = (out / "README.md").read_text()
    assert "B = 32, interval W = 8" in card and "tiny-llama" in card
    assert "| 32 | learned | 1.0123 |" in card  # evaluation numbers found next to the checkpoint
    assert card.index("| learned |") < card.index("| random |")  # best first


def test_the_export_folder_gets_the_umask_mode(scorer_dir, tmp_path, capsys):
    """The export was made in a mkdtemp folder, so it ended up 0700: other users of a shared machine could not read
    the exported scorer. It gets the mode mkdir gives (the umask's), when made and when replaced."""
    out = tmp_path / "export"
    umask = os.umask(0o022)
    try:
        (tmp_path / "ref").mkdir()
        assert stat.S_IMODE((tmp_path / "ref").stat().st_mode) == 0o755
        assert main(["export", str(scorer_dir), "--out", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o755
        os.umask(0o027)
        assert main(["export", str(scorer_dir), "--out", str(out), "--overwrite"]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o750
    finally:
        os.umask(umask)
    assert (out / "model.safetensors").read_bytes() == (scorer_dir / "scorer" / "model.safetensors").read_bytes()
    # no temporary left (the lock file of the export's directory stays beside it: foresight/run_lock.py)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [".export.lock"]


def test_onnx_matches_pytorch(scorer_dir, tmp_path, capsys):
    import onnxruntime as ort

    from foresight.scorer import Scorer

    out = tmp_path / "export"
    assert main(["export", str(scorer_dir / "scorer"), "--out", str(out), "--onnx"]) == 0
    assert "max |onnxruntime - PyTorch|" in capsys.readouterr().out
    scorer = Scorer.from_pretrained(out)
    sess = ort.InferenceSession(str(out / "scorer.onnx"), providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(1)
    for batch, n in ((1, 4), (3, 40)):  # dynamic batch and sequence axes
        x = _features(scorer.config, gen, batch, n)
        with torch.no_grad():
            ref = scorer(x).numpy()
        got = sess.run(None, {"features": x.numpy()})[0]
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 1e-5


def test_exported_scorer_drives_the_learned_policy(scorer_dir, tmp_path, tiny_llama):
    from evaluation.fidelity import evaluate_fidelity
    from evaluation.policies import make_factory

    model, _ = tiny_llama
    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out)]) == 0
    seq = torch.randint(3, 250, (80,), generator=torch.Generator().manual_seed(2)).tolist()
    factory = make_factory(model=model, scorer=str(out), interval=8)
    rec = evaluate_fidelity(model, [seq], ["learned"], [32], 8, policy_factory=factory)[0]
    assert rec["policy"] == "learned" and rec["tokens"] == 80 - 1 - 40 and rec["kl"] > 0


def test_export_errors(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "holds no scorer" in capsys.readouterr().err


def test_export_records_temperature_and_notes(scorer_dir, tmp_path, capsys):
    from foresight.policies import make_policy
    from foresight.scorer import Scorer

    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), "--temperature", "0.003",
                 "--note", "recipe=recipe.sh, 3 rounds", "--note", "temperature_note=chosen on validation"]) == 0
    exp = Scorer.from_pretrained(out)
    assert exp.config.temperature == 0.003
    assert exp.config.provenance["recipe"] == "recipe.sh, 3 rounds"
    assert exp.config.provenance["temperature_note"] == "chosen on validation"
    card = (out / "README.md").read_text()
    assert "- recipe: `recipe.sh, 3 rounds`" in card
    # the recorded temperature is what selection=sample uses when none is given
    assert make_policy("learned", scorer=str(out), selection="sample").sampling_temperature == 0.003
    assert (out / "model.safetensors").read_bytes() == (scorer_dir / "scorer" / "model.safetensors").read_bytes()
    # an export's temperature (the scorer was trained without one) may be replaced by re-exporting the export; the
    # note describing the old value goes, the old value is recorded, the weights stay byte for byte
    again = tmp_path / "again"
    assert main(["export", str(out), "--out", str(again), "--temperature", "0.005",
                 "--note", "temperature_note=chosen again"]) == 0
    exp = Scorer.from_pretrained(again)
    assert exp.config.temperature == 0.005 and exp.config.provenance["temperature_replaced"] == "0.003"
    assert exp.config.provenance["temperature_note"] == "chosen again"
    assert exp.config.provenance["recipe"] == "recipe.sh, 3 rounds"
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_a_re_export_records_its_own_commit(scorer_dir, tmp_path, monkeypatch):
    """A re-export (of an earlier export, e.g. to replace a temperature) kept the first export's commit beside its
    own time; it records its own commit, the earlier one as first_export_git_commit, and none it cannot tell."""
    import evaluation.export as export
    from foresight.scorer import Scorer

    def export_with(commit, src, out):
        monkeypatch.setattr(export, "_git_commit", lambda: commit)
        assert main(["export", str(src), "--out", str(out)]) == 0
        return Scorer.from_pretrained(out).config.provenance

    first = export_with("a" * 40, scorer_dir, tmp_path / "first")
    assert first["export_git_commit"] == "a" * 40 and "first_export_git_commit" not in first
    again = export_with("b" * 40, tmp_path / "first", tmp_path / "again")
    assert again["export_git_commit"] == "b" * 40 and again["first_export_git_commit"] == "a" * 40
    assert again["exported_at"] >= first["exported_at"] and again["exported_from"] == first["exported_from"]
    third = export_with(None, tmp_path / "again", tmp_path / "third")  # no git here: no commit is claimed
    assert "export_git_commit" not in third and third["first_export_git_commit"] == "a" * 40


@pytest.mark.parametrize("args, message", [
    (["--temperature", "0"], "--temperature 0.0: temperature must be a finite number > 0"),
    (["--temperature", "nan"], "`temperature` must be a finite number or null, got nan"),
    (["--temperature", "inf"], "`temperature` must be a finite number or null, got inf"),
    (["--note", "recipe"], "--note recipe: expected KEY=TEXT"),
    (["--note", "=text"], "the key is empty"),
    (["--note", "a=1", "--note", "a=2"], "--note a: given twice"),
    (["--note", "trainer=grpo"], "--note trainer: the scorer's provenance already records trainer"),
    (["--budget", "48"], "--budget and --interval go together: the (B, W) of the cache the exported scorer runs in "
                         "(got only --budget)"),
    (["--interval", "16"], "(got only --interval)"),
    (["--budget", "16", "--interval", "16"], "--budget 16 --interval 16: need 0 < interval < budget"),
    (["--budget", "48", "--interval", "0"], "--budget 48 --interval 0: need 0 < interval < budget"),
])
def test_export_refuses_bad_temperature_notes_and_cache(scorer_dir, tmp_path, capsys, args, message):
    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing written


def test_export_keeps_a_trained_temperature(scorer_dir, tmp_path, capsys):
    from foresight.scorer import Scorer

    src = scorer_dir / "scorer"
    scorer = Scorer.from_pretrained(src)
    scorer.config.temperature = 0.5  # as GRPO records the temperature it trained with
    scorer.save_config(src)
    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), "--temperature", "0.003"]) == 2
    assert "already records temperature 0.5" in capsys.readouterr().err and not out.exists()
    assert main(["export", str(scorer_dir), "--out", str(out), "--temperature", "0.5"]) == 0
    assert Scorer.from_pretrained(out).config.temperature == 0.5


def test_fidelity_of_another_scorer_is_not_quoted(scorer_dir, tmp_path, capsys):
    """A `foresight eval fidelity` output whose settings.json records other scorer weights than the exported ones
    (an earlier round's evaluation): --fidelity naming it is one line, exit 2, nothing written; found beside the
    scorer it is passed over. The card used to quote the other scorer's loss ratio as this scorer's."""
    from foresight.fingerprint import file_sha256

    (scorer_dir / "settings.json").write_text(json.dumps({"model": "tiny-llama", "scorer_sha256": "0" * 64}))
    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), "--fidelity", str(scorer_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "000000000000" in err and "another scorer" in err, err
    assert not out.exists()
    assert main(["export", str(scorer_dir), "--out", str(out)]) == 0
    assert "| learned |" not in (out / "README.md").read_text()
    sha = file_sha256(scorer_dir / "scorer" / "model.safetensors")
    (scorer_dir / "settings.json").write_text(json.dumps({"model": "tiny-llama", "scorer_sha256": sha}))
    assert main(["export", str(scorer_dir), "--out", str(out), "--overwrite", "--fidelity", str(scorer_dir)]) == 0
    assert "| 32 | learned | 1.0123 |" in (out / "README.md").read_text()


def _write_fid(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda r: {**r, "scorer_sha256": "f" * 64}, "ffffffffffff"),  # a card of other weights (another B, another run)
    (lambda r: {k: v for k, v in r.items() if k != "scorer_sha256"}, "does not say which scorer weights"),
    (lambda r: {**r, "loss_ratio": "1.01"}, "'loss_ratio' must be a number"),
    (lambda r: {**r, "budget": "32"}, "'budget' must be an integer"),
])
def test_fidelity_records_the_card_cannot_quote_are_refused(scorer_dir, tmp_path, capsys, edit, message):
    """--fidelity records that measured other weights, that name none (a card_fidelity.json of another scorer used
    to be quoted as this one's), or that hold values of the wrong type (used to crash the card's sort: exit 1):
    one line, exit 2, nothing written. Found beside the scorer they are passed over."""
    records = json.loads((scorer_dir / "fidelity.json").read_text())
    bad = _write_fid(tmp_path / "cards" / "card_fidelity.json", [edit(records[0]), records[1]])
    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), "--fidelity", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(bad) in err, err
    assert not out.exists()
    _write_fid(scorer_dir / "fidelity.json", [edit(records[0]), records[1]])
    assert main(["export", str(scorer_dir), "--out", str(out)]) == 0
    assert "| learned |" not in (out / "README.md").read_text()


def test_an_empty_fidelity_list_is_refused(scorer_dir, tmp_path, capsys):
    bad = _write_fid(tmp_path / "empty.json", [])
    assert main(["export", str(scorer_dir), "--out", str(tmp_path / "o"), "--fidelity", str(bad)]) == 2
    assert "non-empty list" in capsys.readouterr().err


def test_the_export_names_the_weights_its_quoted_records_measured(scorer_dir, tmp_path):
    """Records identified through settings.json are written with the weights' SHA-256, so re-exporting the export
    (the packaged scorers' case: no settings.json there) quotes them again; a training summary.json is quoted only
    beside the scorer it trained."""
    from foresight.fingerprint import file_sha256

    sha = file_sha256(scorer_dir / "scorer" / "model.safetensors")
    records = json.loads((scorer_dir / "fidelity.json").read_text())
    (scorer_dir / "fidelity.json").unlink()
    ev = _write_fid(tmp_path / "ev" / "fidelity.json", [{k: v for k, v in r.items() if k != "scorer_sha256"}
                                                         for r in records])
    (ev.parent / "settings.json").write_text(json.dumps({"model": "tiny-llama", "scorer_sha256": sha}))
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["export", str(scorer_dir), "--out", str(first), "--fidelity", str(ev)]) == 0
    written = json.loads((first / "fidelity.json").read_text())
    assert [r.get("scorer_sha256") for r in written] == [sha, None]  # the learned record only
    assert main(["export", str(first), "--out", str(second)]) == 0
    assert "| 32 | learned | 1.0123 |" in (second / "README.md").read_text()
    # a training summary.json is quoted beside the scorer it trained (run/summary.json, run/scorer), not from the
    # directory above the run (whose scorer/ is not this one)
    summary = json.dumps({"scorer": "somewhere/scorer", "fidelity": [records[0]]})
    (tmp_path / "summary.json").write_text(summary)
    assert main(["export", str(scorer_dir), "--out", str(tmp_path / "o1")]) == 0
    assert "| learned |" not in (tmp_path / "o1" / "README.md").read_text()
    (scorer_dir / "summary.json").write_text(summary)
    assert main(["export", str(scorer_dir), "--out", str(tmp_path / "o2")]) == 0
    assert "| 32 | learned | 1.0123 |" in (tmp_path / "o2" / "README.md").read_text()


@pytest.mark.parametrize("name", ["spread", "newcomer_bonus", "age_prior"])
def test_export_records_a_topk_default_and_checks_the_quoted_topk_runs_against_it(scorer_dir, tmp_path, capsys, name):
    """--spread S / --newcomer-bonus B becomes the learned policy's top-k default for this scorer; a quoted top-k
    record run at another value (or at none, as before the argument existed) is one line, exit 2, nothing written."""
    from foresight.policies import make_policy
    from foresight.scorer import Scorer

    flag, label = f"--{name.replace('_', '-')}", name.replace("_", " ")
    records = json.loads((scorer_dir / "fidelity.json").read_text())
    plain = {**records[0], "policy": "learned (this scorer, top-k)",
             "policy_config": {"selection": "topk", "temperature": 1.0}}  # a run from before the argument existed
    cards = tmp_path / "cards"
    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), flag, "0.005",
                 "--fidelity", str(_write_fid(cards / "plain.json", [plain, records[1]]))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"ran top-k at {name} 0.0" in err and f"{name} 0.005" in err, err
    assert flag in err and not out.exists()
    ran = {**plain, "policy_config": {"selection": "topk", "temperature": 1.0, name: 0.005}}
    assert main(["export", str(scorer_dir), "--out", str(out), flag, "0.005",
                 "--fidelity", str(_write_fid(cards / "ran.json", [ran, records[1]]))]) == 0
    assert getattr(Scorer.from_pretrained(out).config, name) == 0.005
    assert f"top-k with {label} 0.005" in (out / "README.md").read_text()
    pol = make_policy("learned", scorer=str(out))
    assert pol._topk_default(name) == 0.005 and pol.config()[name] == 0.005
    assert make_policy("learned", scorer=str(out), **{name: 0.0}).config()[name] == 0.0  # explicit beats recorded
    assert make_policy("learned", scorer=str(out), selection="sample").config()[name] == 0.0  # top-k's only
    assert main(["export", str(scorer_dir), "--out", str(tmp_path / "o"), flag, "-1"]) == 2
    assert f"{flag} -1.0: {name} must be a finite number >= 0" in capsys.readouterr().err


def test_export_records_both_topk_defaults_in_the_card(scorer_dir, tmp_path):
    from foresight.scorer import Scorer

    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), "--spread", "0.005", "--newcomer-bonus", "0.02"]) == 0
    cfg = Scorer.from_pretrained(out).config
    assert (cfg.spread, cfg.newcomer_bonus) == (0.005, 0.02)
    assert "top-k with spread 0.005, newcomer bonus 0.02" in (out / "README.md").read_text()


def test_export_records_the_default_selection(scorer_dir, tmp_path, capsys):
    """--selection sample becomes the learned policy's default for this scorer (the card says so); it needs a
    recorded temperature: without one, one line, exit 2, nothing written."""
    from foresight.policies import make_policy
    from foresight.scorer import Scorer

    out = tmp_path / "export"
    assert main(["export", str(scorer_dir), "--out", str(out), "--selection", "sample"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--selection sample: selection 'sample' needs a recorded temperature" in err
    assert "--temperature T" in err and not out.exists()
    assert main(["export", str(scorer_dir), "--out", str(out), "--selection", "sample", "--temperature", "0.005",
                 "--spread", "0.005"]) == 0
    assert Scorer.from_pretrained(out).config.selection == "sample"
    card = (out / "README.md").read_text()
    assert ("`learned` policy defaults: `selection=sample` at temperature 0.005 (the default selection); "
            "`selection=topk`: top-k with spread 0.005") in card
    pol = make_policy("learned", scorer=str(out))
    assert (pol.config()["selection"], pol.config()["temperature"], pol.config()["spread"]) == ("sample", 0.005, 0.0)
    assert main(["export", str(scorer_dir), "--out", str(tmp_path / "o"), "--selection", "best"]) == 2
    assert "--selection best: selection must be one of topk, sample" in capsys.readouterr().err


@pytest.mark.parametrize("name, value", [("spread", 0.5), ("newcomer_bonus", 0.5), ("age_prior", 0.5)])
def test_a_recorded_topk_default_decides_as_the_explicit_argument(tiny_llama, name, value):
    """The learned policy with a scorer recording a top-k default evicts exactly as with the argument given, and
    otherwise as plain top-k would not (the recorded value is used); under sampling the recorded value is not."""
    import foresight
    from foresight.models import model_fingerprint
    from foresight.policies import make_policy
    from foresight.scorer import Scorer, ScorerConfig

    model, _ = tiny_llama
    fp = model_fingerprint(model)
    plain = Scorer(ScorerConfig(fingerprint=fp, budget=16, interval=4), seed=2)
    recorded = Scorer(ScorerConfig(fingerprint=fp, budget=16, interval=4, **{name: value}), seed=2)
    seq = [list(torch.randint(0, 100, (60,), generator=torch.Generator().manual_seed(0)).tolist())]

    def ce(scorer, **kw):
        return foresight.replay(model, seq, policy=make_policy("learned", scorer=scorer, **kw), budget=16,
                                interval=4).ce

    torch.testing.assert_close(ce(recorded), ce(plain, **{name: value}))
    assert not torch.allclose(ce(recorded), ce(plain))
    torch.testing.assert_close(ce(recorded, **{name: 0.0}), ce(plain))
    sampled = {"selection": "sample", "temperature": 0.1, "seed": 3}
    torch.testing.assert_close(ce(recorded, **sampled), ce(plain, **sampled))


def test_export_moves_a_scorer_to_another_cache(scorer_dir, tmp_path, tiny_llama, capsys):
    """``--budget B --interval W`` records the cache a scorer runs in when it is not the one it was trained at: the
    learned policy then runs it there without any_budget, with the feature window it was trained with, so its
    evictions are exactly those of the original scorer transferred with any_budget=true; the weights stay byte for
    byte; the (B, W) it was trained at is recorded and printed in the card."""
    from evaluation.fidelity import evaluate_fidelity
    from evaluation.policies import make_factory
    from foresight.policies import make_policy
    from foresight.scorer import Scorer

    model, _ = tiny_llama
    out = tmp_path / "moved"
    assert main(["export", str(scorer_dir), "--out", str(out), "--budget", "48", "--interval", "16"]) == 0
    cfg = Scorer.from_pretrained(out).config
    assert (cfg.budget, cfg.interval, cfg.window, cfg.feature_window) == (48, 16, 8, 8)
    assert cfg.provenance["trained_at"] == {"budget": 32, "interval": 8}
    assert json.loads((out / "config.json").read_text())["window"] == 8
    assert (out / "model.safetensors").read_bytes() == (scorer_dir / "scorer" / "model.safetensors").read_bytes()
    card = (out / "README.md").read_text()
    assert "runs at budget B = 48, interval W = 16 (trained at B = 32, W = 8; its recent-query window stays 8)" in card
    # the card found beside the source was measured at B=32: not quoted for the scorer moved to B=48
    assert "| 32 | learned |" not in card and "No fidelity results were found" in card
    assert make_policy("learned", scorer=str(out)).extractor.window == 8
    seqs = [torch.randint(3, 250, (120,), generator=torch.Generator().manual_seed(s)).tolist() for s in (3, 4)]
    moved = evaluate_fidelity(model, seqs, ["learned"], [48], 16,
                              policy_factory=make_factory(model=model, scorer=str(out), interval=16))[0]
    transfer = make_factory(model=model, scorer=str(scorer_dir / "scorer"), interval=16,
                            policy_kwargs={"learned": {"any_budget": True}})
    sent = evaluate_fidelity(model, seqs, ["learned"], [48], 16, policy_factory=transfer)[0]
    assert moved["per_trace_ratio"] == sent["per_trace_ratio"] and moved["kl"] == sent["kl"]
    # the window it was trained with is what made them equal: the same config reading a 16-query window differs
    wide = tmp_path / "wide"
    shutil.copytree(out, wide)
    config = json.loads((wide / "config.json").read_text())
    del config["window"]
    (wide / "config.json").write_text(json.dumps(config))
    other = evaluate_fidelity(model, seqs, ["learned"], [48], 16,
                              policy_factory=make_factory(model=model, scorer=str(wide), interval=16))[0]
    assert other["per_trace_ratio"] != moved["per_trace_ratio"]
    # at its old (B, W) the moved scorer is refused like any scorer of another cache; moved back, it is as trained
    with pytest.raises(ValueError, match="is for B=48 W=16, not B=32 W=8"):
        make_policy("learned", scorer=str(out)).check_cache(32, 8)
    back = tmp_path / "back"
    assert main(["export", str(out), "--out", str(back), "--budget", "32", "--interval", "8"]) == 0
    cfg = Scorer.from_pretrained(back).config
    assert (cfg.budget, cfg.interval, cfg.window) == (32, 8, None) and "window" not in json.loads(
        (back / "config.json").read_text())
    assert cfg.provenance["trained_at"] == {"budget": 32, "interval": 8}


def test_a_moved_scorer_quotes_only_records_measured_in_its_new_cache(scorer_dir, tmp_path, capsys):
    fid = json.loads((scorer_dir / "fidelity.json").read_text())
    args = ["export", str(scorer_dir), "--budget", "48", "--interval", "16", "--fidelity", str(scorer_dir)]
    assert main([*args, "--out", str(tmp_path / "old")]) == 2
    err = capsys.readouterr().err
    assert ("its record 'learned' was measured at B=32 W=8, and the exported scorer runs at B=48 W=16; quote runs in "
            "that cache") in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "old").exists()
    (scorer_dir / "fidelity.json").write_text(json.dumps([{**r, "budget": 48, "interval": 16} for r in fid]))
    assert main([*args, "--out", str(tmp_path / "new")]) == 0
    assert "| 48 | learned | 1.0123 |" in (tmp_path / "new" / "README.md").read_text()


def test_the_card_shows_stage_records_as_nested_bullets():
    """A refinement stage's record (a dict with hundreds of trace ids and a config) and the earlier stages' records
    read as nested bullets on the card, trace lists as their length, not as one line of JSON."""
    from evaluation.model_card import _provenance_lines

    stage = {"init_scorer": "a/scorer", "train_traces": [f"t{i}" for i in range(20)],
             "config": {"steps": 4, "lr": 0.01}}
    lines = _provenance_lines("e2e", {**stage, "init_scorer": "b/scorer"})
    lines += _provenance_lines("earlier_stages", [{"stage": "e2e", **stage}])
    lines += _provenance_lines("trainer", "sl") + _provenance_lines("empty", {})
    assert lines == [
        "- e2e:", "  - init_scorer: `b/scorer`", "  - train_traces: 20 entries (listed in `config.json`)",
        "  - config:", "    - steps: `4`", "    - lr: `0.01`",
        "- earlier_stages:", "  - 1:", "    - stage: `e2e`", "    - init_scorer: `a/scorer`",
        "    - train_traces: 20 entries (listed in `config.json`)", "    - config:", "      - steps: `4`",
        "      - lr: `0.01`",
        "- trainer: `sl`", "- empty: `{}`"]
