"""No remote code and no pickles, ever: a model directory's `auto_map` Python and a pickled `pytorch_model.bin` are
never run, even with `yes |` answering every question (foresight/models.py)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from foresight.models import ModelLoadError
from tests.safety.test_resume_safety import _Payload  # unpickling it touches the file it names

REPO = Path(__file__).resolve().parents[2]


def _tiny_dir(path: Path) -> Path:
    """tiny-llama saved as a model directory (config, tokenizer, model.safetensors)."""
    from foresight.tiny_models import build_tiny_model

    model, tok = build_tiny_model("tiny-llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _remote_code_dir(path: Path, sentinel: Path, model_type: str) -> Path:
    """A model directory whose config maps its classes to a Python file that writes ``sentinel`` when imported."""
    _tiny_dir(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(model_type=model_type, auto_map={"AutoConfig": "evil.EvilConfig",
                                                 "AutoModelForCausalLM": "evil.EvilModel"})
    (path / "config.json").write_text(json.dumps(cfg))
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    tok_cfg["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (path / "evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('ran')\n"
                                  "from transformers import LlamaConfig as EvilConfig, LlamaForCausalLM as EvilModel\n"
                                  "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
    return path


def _pickle_only_dir(path: Path, sentinel: Path) -> Path:
    """tiny-llama with its weights replaced by a pickle whose loading writes ``sentinel``."""
    _tiny_dir(path)
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": _Payload(sentinel)}))
    return path


def _yes_generate(model_dir: Path) -> subprocess.CompletedProcess:
    """`yes | foresight generate --model DIR` in a shell: every question transformers could ask answered yes."""
    cmd = f"yes | {sys.executable} -m foresight generate --model {model_dir} --prompt hi --max-new-tokens 2"
    return subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_the_planted_code_really_runs_when_trusted(tmp_path):
    """Guards the tests below: the planted code is live (imported here on purpose, once; the pickle's guard is
    tests/safety/test_resume_safety.py::test_payload_really_executes_when_unpickled)."""
    sentinel = tmp_path / "ran"
    d = _remote_code_dir(tmp_path / "m", sentinel, "evilmodel")
    sys.path.insert(0, str(d))
    try:
        __import__("evil")
    finally:
        sys.path.remove(str(d))
        sys.modules.pop("evil", None)
    assert sentinel.exists()


@pytest.mark.parametrize("model_type", ["evilmodel", "llama"])
def test_auto_map_code_never_runs_even_with_yes_piped(tmp_path, model_type):
    """transformers asked "run custom code? [y/N]" and `yes | foresight generate --model DIR` ran it. An architecture
    transformers does not ship is refused in one line; one it ships loads with its own classes; neither runs DIR's
    Python."""
    sentinel = tmp_path / "ran"
    model_dir = _remote_code_dir(tmp_path / "model", sentinel, model_type)
    out = _yes_generate(model_dir)
    assert not sentinel.exists(), out.stderr
    if model_type == "evilmodel":
        assert out.returncode == 2, out.stderr
        err = out.stderr.strip().splitlines()
        assert len(err) == 1 and "needs its own Python code" in err[0] and "never runs" in err[0], out.stderr
        import foresight

        with pytest.raises(ModelLoadError, match="never runs"):
            foresight.load_model(str(model_dir))
    else:
        assert out.returncode == 0, out.stderr
    assert not sentinel.exists()


def test_pickled_weights_are_refused_in_one_line(tmp_path):
    """A directory holding only pytorch_model.bin was unpickled through transformers, and refused as exit 1
    "internal error"."""
    import foresight

    sentinel = tmp_path / "ran"
    model_dir = _pickle_only_dir(tmp_path / "model", sentinel)
    out = _yes_generate(model_dir)
    assert out.returncode == 2, out.stderr
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "pytorch_model.bin" in err[0] and "never loads" in err[0], out.stderr
    with pytest.raises(ModelLoadError, match="a pickle, which foresight never loads"):
        foresight.load_model(str(model_dir))
    assert not sentinel.exists()


def test_a_config_naming_a_pickle_as_its_weights_is_refused(tmp_path):
    """transformers loads the file a config's `transformers_weights` names, safetensors or not."""
    import foresight

    sentinel = tmp_path / "ran"
    model_dir = _tiny_dir(tmp_path / "model")
    (model_dir / "adapter_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": _Payload(sentinel)}))
    cfg = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**cfg, "transformers_weights": "adapter_model.bin"}))
    with pytest.raises(ModelLoadError, match="not a safetensors file"):
        foresight.load_model(str(model_dir))
    assert not sentinel.exists()
