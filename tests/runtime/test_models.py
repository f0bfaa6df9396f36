"""Model loading: built-in names, error paths, the cached GGUF conversion."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import foresight
from foresight import models
from foresight.models import ModelLoadError
from foresight.tiny_models import build_tiny_model


def test_tiny_models_are_deterministic():
    a, _ = build_tiny_model("tiny-qwen2")
    b, _ = build_tiny_model("tiny-qwen2")
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na


def test_byte_tokenizer_round_trip():
    _, tok = build_tiny_model("tiny-llama")
    text = "x = 3/4 → \\boxed{7}"
    assert tok.decode(tok(text)["input_ids"]) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "name,match",
    [
        ("no-such-model", "Unknown model"),
        ("./does/not/exist", "not found"),
        ("/tmp/definitely-missing.gguf", "GGUF file not found"),
    ],
)
def test_load_errors(name, match):
    with pytest.raises(ModelLoadError, match=match):
        foresight.load_model(name)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        foresight.load_model(str(tmp_path))


def test_gguf_without_gguf_package(monkeypatch, tmp_path):
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    with pytest.raises(ModelLoadError, match="needs the 'gguf' package"):
        foresight.load_model(str(fake))


def test_local_directory_round_trip(tmp_path):
    model, tok = build_tiny_model("tiny-llama")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = foresight.load_model(str(tmp_path), device="cpu")
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert ltok.padding_side == "left"


@pytest.mark.slow
def test_default_model_loads_from_cached_copy(smollm2):
    import time

    from foresight.models import cache_dir

    model, tok = smollm2
    assert (cache_dir() / "models" / "smollm2-135m" / "model.safetensors").exists()
    assert model.config.num_key_value_heads == 3 and model.config.num_hidden_layers == 30
    t0 = time.perf_counter()
    foresight.load_model("smollm2-135m", device="cpu")
    assert time.perf_counter() - t0 < 15  # seconds, not the ~18-40 s of a fresh GGUF dequantisation


def test_concurrent_first_loads_convert_once(monkeypatch, tmp_path):
    """Two ranks starting on a fresh machine: one converts the GGUF, the other waits for its copy (before the lock,
    the second conversion deleted the directory the first rank was loading)."""
    import threading
    import time

    calls = []

    def slow_convert(gguf_file, out_dir):
        calls.append(out_dir)
        time.sleep(0.3)
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(models, "convert_gguf", slow_convert)
    target = tmp_path / "models" / "m"
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(models.converted(tmp_path / "m.gguf", target)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [target]
    assert seen == [target] * 3 and (target / "config.json").exists()


def test_a_killed_conversions_folder_is_removed_by_the_next_one(monkeypatch, tmp_path):
    """A conversion killed mid-write left its hidden temporary folder (hundreds of MB) in the cache for good; the
    next conversion, holding the lock, removes it. Another model's temporaries are left alone."""
    target = tmp_path / "models" / "m"
    stale, other = target.parent / ".m.tmp-123-abc", target.parent / ".mm.tmp-9-x"
    for d in (stale, other):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 10)

    def convert(gguf_file, out_dir):
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(models, "convert_gguf", convert)
    assert models.converted(tmp_path / "m.gguf", target) == target
    assert not stale.exists() and other.exists() and (target / "config.json").exists()


def test_gguf_conversion_is_readable_by_all_and_a_failed_one_keeps_the_earlier_copy(monkeypatch, tmp_path):
    """convert_gguf wrote into a mkdtemp folder, so the cached copy was 0700 (other users of a shared cache could not
    read it), and deleted the earlier copy before renaming the new one in. Now the copy gets the umask's mode and a
    conversion that fails midway, or whose rename into place fails, leaves the earlier copy whole. (A tiny model
    stands in for the GGUF's.)"""
    model, tok = build_tiny_model("tiny-llama")
    monkeypatch.setattr(models, "_require_gguf", lambda: None)
    monkeypatch.setattr(models, "AutoModelForCausalLM", SimpleNamespace(from_pretrained=lambda *a, **k: model))
    monkeypatch.setattr(models, "AutoTokenizer", SimpleNamespace(from_pretrained=lambda *a, **k: tok))
    gguf, out = tmp_path / "m.gguf", tmp_path / "models" / "m"

    def tree():
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    umask = os.umask(0o022)
    try:
        models.convert_gguf(gguf, out)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    before = tree()
    assert {"config.json", "model.safetensors", "foresight_source.json"} <= set(before)

    def no_space(directory, *a, **k):  # the tokenizer's files half written, then the disk is full
        (Path(directory) / "tokenizer.json").write_text("{")
        raise OSError(28, "No space left on device")

    replace = os.replace

    def cannot_rename(src, dst):  # the complete new copy cannot be renamed into place
        if ".tmp-" in Path(src).name:
            raise OSError(5, "Input/output error")
        replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(tok, "save_pretrained", no_space)
        with pytest.raises(OSError, match="No space left"):
            models.convert_gguf(gguf, out)
    assert tree() == before and sorted(p.name for p in out.parent.iterdir()) == ["m"]  # no temporary left
    with monkeypatch.context() as m:
        m.setattr(os, "replace", cannot_rename)
        with pytest.raises(OSError, match="Input/output error"):
            models.convert_gguf(gguf, out)
    assert tree() == before and sorted(p.name for p in out.parent.iterdir()) == ["m"]
    assert models.converted(gguf, out) == out  # the earlier copy is used as it is
