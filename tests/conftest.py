"""Shared fixtures: tiny random models (cached per session) and the default model for slow tests."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TINY = ["tiny-llama", "tiny-qwen3"]
_CACHE: dict[str, tuple] = {}


def load_script(path: str, name: str | None = None) -> ModuleType:
    """``benchmarks/<path>`` (a script, not a package module) imported as a module named ``name``."""
    spec = importlib.util.spec_from_file_location(name or Path(path).stem,
                                                  Path(__file__).resolve().parents[1] / "benchmarks" / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Killed(BaseException):
    """Raised by :func:`kill_while_writing`: the process "dies" in a file write."""


def kill_while_writing(monkeypatch, name_part: str) -> None:
    """Make ``Path.write_text`` of any file whose name contains ``name_part`` behave like a kill -9 in the write: the
    file is opened (truncated) and :class:`Killed` is raised before anything is written."""
    write_text = Path.write_text

    def killed(self, text, *a, **k):
        if name_part in self.name:
            self.open("w").close()
            raise Killed
        return write_text(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", killed)


@contextlib.contextmanager
def run_in_progress(out_dir: Path):
    """Another process holds ``out_dir``'s run lock (:mod:`foresight.run_lock`: a run on it in progress); it
    is killed (-9) on exit, as a run that dies."""
    from foresight.run_lock import lock_path

    code = ("import sys; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
            "print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock_path(out_dir))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield
    finally:
        proc.kill()
        proc.wait(timeout=60)


def get_model(name: str):
    """Load (once per test session) a model by name; tests must not mutate it."""
    if name not in _CACHE:
        import foresight

        _CACHE[name] = foresight.load_model(name, device="cpu")
    return _CACHE[name]


def trace_dir(out: Path) -> Path:
    """``foresight trace`` output at ``out``: two synthetic problems, one 40-token tiny-llama sample each."""
    from foresight.cli import main

    assert main(["trace", "--model", "tiny-llama", "--data", "synthetic", "--limit", "2", "--max-new-tokens", "40",
                 "--batch-size", "2", "--out", str(out), "--no-progress"]) == 0
    return out


def save_random_traces(model, path, lengths, seed: int = 3, prompt_len: int = 10, prefix: str = "p") -> dict[str, list]:
    """Save random token traces with the columns of ``golden.traces.load_traces`` (trace ``<prefix><i>#0`` of
    problem ``<prefix><i>`` per entry of ``lengths``) as a ``datasets`` dataset at ``path``; return the columns."""
    import json

    import datasets

    from foresight.models import model_fingerprint

    gen = torch.Generator().manual_seed(seed)
    fp = json.dumps(model_fingerprint(model))
    rows = {k: [] for k in ("trace_id", "problem_id", "sample", "input_ids", "prompt_len", "answer", "settings",
                            "fingerprint")}
    for i, n in enumerate(lengths):
        rows["trace_id"].append(f"{prefix}{i}#0")
        rows["problem_id"].append(f"{prefix}{i}")
        rows["sample"].append(0)
        rows["input_ids"].append(torch.randint(3, 250, (n,), generator=gen).tolist())
        rows["prompt_len"].append(prompt_len)
        rows["answer"].append("")
        rows["settings"].append("{}")
        rows["fingerprint"].append(fp)
    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    return rows


def seeded_lora(model, r: int = 2, targets=("q_proj", "v_proj"), seed: int = 0, std: float = 0.3):
    """Wrap ``model`` (on the CPU) in a peft LoRA (alpha = 2r) whose A and B are drawn from ``seed`` alone, B ~
    N(0, std) rather than peft's zeros so the adapter changes outputs and A receives gradients; the CPU generator
    is the only one forked, so the same seed gives the same weights whichever device the model moves to after."""
    from peft import LoraConfig, get_peft_model

    from foresight.adapters import quiet_peft

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with quiet_peft():
            peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets)))
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p.data, std=std)
    return peft_model


def save_random_adapter(path, model_name: str = "tiny-llama", r: int = 4, seed: int = 0, std: float = 0.2,
                        targets=("q_proj", "k_proj", "v_proj", "o_proj")):
    """Save a peft LoRA adapter for the tiny model ``model_name`` with non-zero (random) A and B at ``path``, so
    loading it changes the model's outputs; return ``path``."""
    from foresight.tiny_models import build_tiny_model

    model, _ = build_tiny_model(model_name)
    seeded_lora(model, r=r, targets=targets, seed=seed, std=std).save_pretrained(str(path), save_embedding_layers=False)
    return path


@pytest.fixture(params=TINY)
def tiny(request):
    return get_model(request.param)


@pytest.fixture
def tiny_llama():
    return get_model("tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    return get_model("smollm2-135m")
