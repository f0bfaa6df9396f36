"""Scorers as Hugging Face Hub models: ``from_pretrained`` of a directory, a shipped name or a Hub id (from the Hub
cache; offline, one line), ``save_pretrained`` with ``model_type``, ``push_to_hub``, and a model card whose YAML
metadata ``huggingface_hub.ModelCard`` parses (what ``foresight export`` writes)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from huggingface_hub import ModelCard

import foresight.scorer_hub as scorer_hub
from foresight.cli import main
from foresight.errors import ForesightError
from foresight.models import model_fingerprint
from foresight.scorer import Scorer, ScorerConfig, shipped_scorers
from foresight.scorer_hub import LIBRARY_NAME, MODEL_TYPE, TAGS


@pytest.fixture
def scorer(tiny_llama):
    s = Scorer(ScorerConfig(model_fingerprint(tiny_llama[0]), budget=32, interval=8, provenance={"steps": 3}), seed=7)
    with torch.no_grad():
        s.feature_std.uniform_(0.5, 2.0)
    return s


def _same(a: Scorer, b: Scorer) -> None:
    assert a.config.to_dict() == b.config.to_dict()
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_save_pretrained_then_from_pretrained_is_the_same_scorer(scorer, tmp_path):
    scorer.save_pretrained(tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE
    _same(Scorer.from_pretrained(tmp_path / "s"), scorer)


def test_a_scorer_directory_from_before_model_type_still_loads_and_another_model_type_is_refused(scorer, tmp_path):
    scorer.save_pretrained(tmp_path / "s")
    path = tmp_path / "s" / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in config.items() if k != "model_type"}))
    _same(Scorer.from_pretrained(tmp_path / "s"), scorer)
    path.write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ForesightError, match="model_type is 'llama', not 'foresight-scorer'"):
        Scorer.from_pretrained(tmp_path / "s")


def _hub_cache(root, repo_id: str, files_from) -> None:
    """``repo_id`` as ``huggingface_hub`` keeps a downloaded snapshot (refs/main -> snapshots/<commit>/)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(files_from, repo / "snapshots" / ("0" * 40))


def test_a_hub_id_loads_from_the_hub_cache_and_offline_it_is_one_line(scorer, tmp_path):
    scorer.save_pretrained(tmp_path / "s")
    _hub_cache(tmp_path / "hub", "someone/tiny-scorer", tmp_path / "s")
    got = Scorer.from_pretrained("someone/tiny-scorer", cache_dir=tmp_path / "hub", local_files_only=True)
    _same(got, scorer)
    with pytest.raises(ForesightError) as err:
        Scorer.from_pretrained("someone/not-downloaded", cache_dir=tmp_path / "hub", local_files_only=True)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("scorer 'someone/not-downloaded' is not a local directory nor a "
                                              "shipped scorer, and the Hugging Face Hub did not give it")
    with pytest.raises(ForesightError, match="not a scorer directory"):  # a path, never tried online
        Scorer.from_pretrained(tmp_path / "missing" / "dir")


def test_push_to_hub_uploads_the_saved_files_with_a_card_the_hub_parses(scorer, tmp_path, monkeypatch):
    pushed = {}

    def fake_push(directory, repo_id, **kwargs):
        pushed["files"] = sorted(p.name for p in directory.iterdir())
        pushed["card"] = ModelCard.load(directory / "README.md")
        pushed["repo_id"] = repo_id
        return "https://huggingface.co/someone/s/commit/0"

    monkeypatch.setattr(scorer_hub, "push", fake_push)
    assert scorer.push_to_hub("someone/s").endswith("/commit/0")
    assert pushed["files"] == ["README.md", "config.json", "model.safetensors"] and pushed["repo_id"] == "someone/s"
    data = pushed["card"].data.to_dict()
    assert data["library_name"] == LIBRARY_NAME and data["license"] == "apache-2.0" and data["tags"] == TAGS
    assert data.get("base_model") is None  # tiny-llama is no Hub model


def test_export_writes_a_card_whose_yaml_names_the_base_model_and_the_metrics_with_their_traces(scorer, tmp_path):
    from foresight.fingerprint import file_sha256

    run = tmp_path / "run"
    scorer.save_pretrained(run / "scorer")
    sha = file_sha256(run / "scorer" / "model.safetensors")
    records = [{"policy": "learned", "budget": 32, "interval": 8, "loss_ratio": 1.01234, "traces": 12,
                "tokens": 500, "scorer_sha256": sha},
               {"policy": "tova", "budget": 32, "interval": 8, "loss_ratio": 1.2, "traces": 12, "tokens": 500}]
    (run / "fidelity.json").write_text(json.dumps(records))
    assert main(["export", str(run), "--out", str(tmp_path / "out"), "--base-model", "someone/tiny-llama"]) == 0
    card = ModelCard.load(tmp_path / "out" / "README.md")
    data = card.data.to_dict()
    assert {"base_model", "library_name", "license", "tags", "model-index"} <= set(data)
    assert data["base_model"] == "someone/tiny-llama" and data["library_name"] == LIBRARY_NAME
    results = card.data.eval_results
    assert [(r.metric_type, r.metric_value) for r in results] == [("loss_ratio", 1.0123), ("loss_ratio", 1.2)]
    assert all(r.dataset_name.startswith("12 held-out traces (") and str(run / "fidelity.json") in r.dataset_name
               for r in results)
    exported = Scorer.from_pretrained(tmp_path / "out")  # the weights as trained; the provenance gains the export's
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in scorer.state_dict().items())


@pytest.mark.parametrize("name", sorted(shipped_scorers()))
def test_every_shipped_scorer_is_a_hub_model(name):
    card = ModelCard.load(shipped_scorers()[name] / "README.md")
    data = card.data.to_dict()
    assert data["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and data["library_name"] == LIBRARY_NAME
    assert card.data.eval_results and all(r.metric_type == "loss_ratio" for r in card.data.eval_results)
    config = json.loads((shipped_scorers()[name] / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE and set(config["fingerprint"]["weights"]) == {
        "float32", "bfloat16", "float16"}
