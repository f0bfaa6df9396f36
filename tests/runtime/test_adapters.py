"""PEFT adapters on every job (docs/training.md, adaptation): ``load_model(adapter=...)``, the fingerprint, ``--adapter``."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

import foresight
from foresight.adapters import AdapterError
from foresight.cli import build_parser, main
from foresight.fingerprint import ModelMismatchError, check_same_model
from tests.conftest import get_model, save_random_adapter

#: Every command that loads a model, as argv prefixes (train sl/grpo take the `adapter` config key instead).
MODEL_COMMANDS = [["generate"], ["trace"], ["golden"], ["eval", "fidelity"], ["eval", "aime"], ["bench"]]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return save_random_adapter(tmp_path_factory.mktemp("adapter") / "lora")


def _ids(n=60, seed=0):
    return torch.randint(3, 200, (1, n), generator=torch.Generator().manual_seed(seed))


def test_adapter_changes_the_model_and_its_fingerprint(adapter):
    base, _ = get_model("tiny-llama")
    adapted, _ = foresight.load_model("tiny-llama", device="cpu", adapter=adapter)
    assert type(adapted) is type(base)  # merged: the runtime sees a plain transformers model
    a = foresight.replay(base, _ids(), "h2o", 16, 4).ce
    b = foresight.replay(adapted, _ids(), "h2o", 16, 4).ce
    assert not torch.allclose(a, b, equal_nan=True)
    fa, fb = foresight.model_fingerprint(base), foresight.model_fingerprint(adapted)
    assert "adapter" not in fa  # fingerprints without an adapter are what they always were
    assert fb["adapter"]["r"] == 4 and len(fb["adapter"]["sha256"]) == 64
    assert fb["adapter"]["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    with pytest.raises(ModelMismatchError, match=r"adapter: none vs LORA r=4 sha256 [0-9a-f]{12}"):
        check_same_model(fa, adapted, "scorer S")
    with pytest.raises(ModelMismatchError, match=r"adapter: LORA r=4 sha256 [0-9a-f]{12} vs none"):
        check_same_model(fb, base, "traces T")
    check_same_model(json.dumps(fb), adapted, "traces T")  # same adapter: accepted


def test_another_adapter_is_another_model(adapter, tmp_path):
    other = save_random_adapter(tmp_path / "other", seed=1)
    a, _ = foresight.load_model("tiny-llama", device="cpu", adapter=adapter)
    b, _ = foresight.load_model("tiny-llama", device="cpu", adapter=other)
    with pytest.raises(ModelMismatchError, match="adapter: LORA"):
        check_same_model(foresight.model_fingerprint(a), b, "labels L")


def test_unmerged_adapter_matches_merged_and_trains(adapter):
    from peft import PeftModel

    merged, _ = foresight.load_model("tiny-llama", device="cpu", adapter=adapter)
    peft_model, _ = foresight.load_model("tiny-llama", device="cpu", adapter=adapter, merge_adapter=False)
    assert isinstance(peft_model, PeftModel)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert foresight.model_fingerprint(peft_model) == foresight.model_fingerprint(merged)
    a = foresight.replay(merged, _ids(), "full").ce
    b = foresight.replay(peft_model, _ids(), "full").ce
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, equal_nan=True)
    with peft_model.disable_adapter():  # the base model back, without a second copy
        c = foresight.replay(peft_model, _ids(), "full").ce
    torch.testing.assert_close(c, foresight.replay(get_model("tiny-llama")[0], _ids(), "full").ce, equal_nan=True)


def test_adapter_of_another_base_model_is_refused(adapter):
    with pytest.raises(AdapterError, match=r"made for 'tiny-llama', not for the model 'tiny-qwen3'"):
        foresight.load_model("tiny-qwen3", device="cpu", adapter=adapter)


def test_adapter_trained_here_is_checked_against_its_base_fingerprint(adapter, tmp_path):
    from foresight.adapters import TRAINING_META

    d = tmp_path / "lora"
    shutil.copytree(adapter, d)
    fp = foresight.model_fingerprint(get_model("tiny-qwen3")[0])
    (d / TRAINING_META).write_text(json.dumps({"base_fingerprint": fp}))
    with pytest.raises(AdapterError, match=r"adapter .*lora: made with another model \('tiny-qwen3'"):
        foresight.load_model("tiny-llama", device="cpu", adapter=d)


@pytest.mark.parametrize("damage,match", [
    ("missing", "adapter directory not found"),
    ("no_config", "has no adapter_config.json"),
    ("bad_json", "is not valid JSON"),
    ("pickle_only", "adapter_model.bin is a pickle, which is never loaded"),
])
def test_bad_adapter_dirs_are_refused_before_loading(adapter, tmp_path, damage, match):
    d = tmp_path / "lora"
    if damage != "missing":
        shutil.copytree(adapter, d)
    if damage == "no_config":
        (d / "adapter_config.json").unlink()
    elif damage == "bad_json":
        (d / "adapter_config.json").write_text("{oops")
    elif damage == "pickle_only":
        (d / "adapter_model.safetensors").rename(d / "adapter_model.bin")
    with pytest.raises(AdapterError, match=match):
        foresight.load_model("tiny-llama", device="cpu", adapter=d)


def _subparser(parser, names):
    for name in names:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


@pytest.mark.parametrize("cmd", MODEL_COMMANDS, ids=lambda c: "-".join(c))
def test_every_model_command_takes_adapter(cmd, adapter):
    action = next(a for a in _subparser(build_parser(), cmd)._actions if "--adapter" in a.option_strings)
    assert action.type(str(adapter)) == str(adapter)
    with pytest.raises(argparse.ArgumentTypeError, match="adapter directory not found"):
        action.type(str(adapter) + "-missing")


def test_generate_with_and_without_adapter_differ(adapter, capsys):
    argv = ["generate", "--model", "tiny-llama", "--prompt", "2+2=", "--max-new-tokens", "24", "--device", "cpu",
            "--policy", "h2o", "--budget", "8", "--interval", "2", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--adapter", str(adapter)]) == 0
    adapted = json.loads(capsys.readouterr().out)
    assert plain["token_ids"] != adapted["token_ids"]


def test_traces_of_an_adapted_model_are_refused_by_the_base_model(adapter, tmp_path, capsys):
    traces = tmp_path / "traces"
    assert main(["trace", "--model", "tiny-llama", "--adapter", str(adapter), "--data", "synthetic", "--limit", "2",
                 "--max-new-tokens", "30", "--out", str(traces), "--no-progress", "--device", "cpu"]) == 0
    from golden.traces import load_traces

    fp = json.loads(load_traces(traces)["fingerprint"][0])
    assert fp["adapter"]["sha256"]
    capsys.readouterr()
    rc = main(["golden", "--model", "tiny-llama", "--traces", str(traces), "--out", str(tmp_path / "labels"),
               "--budget", "16", "--interval", "4", "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "adapter: LORA r=4" in err and "vs none" in err


def test_trainers_take_the_adapter_key_and_refuse_artefacts_of_the_base_model(adapter, tmp_path):
    from foresight.errors import ForesightError
    from foresight.scorer import Scorer, ScorerConfig
    from tests.conftest import save_random_traces
    from training.distributed import DistInfo
    from training.grpo import GRPOConfig, GRPOTask
    from training.loop import resume_settings, task_model
    from training.sl_config import SLConfig

    ds = str(Path(__file__).resolve().parents[2] / "configs" / "deepspeed" / "zero0.json")
    base, _ = get_model("tiny-llama")
    save_random_traces(base, tmp_path / "traces", [40, 44, 48])
    Scorer(ScorerConfig(foresight.model_fingerprint(base), budget=16, interval=4, hidden=4)).save_pretrained(
        tmp_path / "scorer")
    keys = dict(model="tiny-llama", adapter=str(adapter), traces=str(tmp_path / "traces"), device="cpu", deepspeed=ds)
    assert SLConfig.from_dict({**keys, "labels": "l"}).adapter == str(adapter)
    cfg = GRPOConfig.from_dict({**keys, "init_scorer": str(tmp_path / "scorer")})
    dist = DistInfo(0, 1, 0, torch.device("cpu"))
    model = task_model(cfg, dist)
    assert foresight.model_fingerprint(model)["adapter"]["sha256"]
    settings = resume_settings(cfg, 1, {})  # the adapter is part of the run by content, not by path
    assert "adapter" in settings and settings["adapter"] != str(adapter)
    with pytest.raises(ForesightError, match=r"adapter: none vs LORA r=4"):  # the SL scorer was made without it
        GRPOTask(cfg, dist, model=model)
