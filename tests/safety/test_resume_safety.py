"""`--resume` is safe: nothing is unpickled, other settings are refused by name, a kill at any point of a
checkpoint write leaves a resumable state, and metrics.jsonl never repeats steps (training/checkpoint.py)."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from foresight.errors import ForesightError
from tests.conftest import run_in_progress
from tests.training.test_grpo_train import tiny_grpo  # noqa: F401  (a fixture)
from tests.training.test_sl import B, REPO, W, _cfg, _make_data
from training import checkpoint as ckpt
from training import state_io
from training.settings_check import check_settings


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return _make_data(tmp_path_factory.mktemp("resume_data"))


@pytest.fixture(scope="module")
def stopped(tiny_data, tmp_path_factory):
    """A run stopped after 4 of 8 steps with its checkpoint at step 4 (copied per test by `_copy`)."""
    from training.sl import run_sl

    out = tmp_path_factory.mktemp("stopped") / "run"
    part = run_sl(_cfg(tiny_data, out, checkpoint_every=4, max_steps_per_run=4))
    assert not part["finished"]
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _cli(tiny_data, out: Path, *extra: str) -> list[str]:
    traces, labels = tiny_data
    return ["train", "sl", "--config", str(REPO / "configs" / "sl.yaml"), "model=tiny-llama", f"traces={traces}",
            f"labels={labels}", f"budget={B}", f"interval={W}", "heldout=2", "steps=8", "micro_batch=2",
            "warmup_steps=2", "checkpoint_every=4", "log_every=1", "eval_every=0", "eval_fidelity=false",
            f"out_dir={out}", f"feature_cache={out.parent / 'features'}", "device=cpu",
            f"deepspeed={REPO / 'configs' / 'deepspeed' / 'zero0.json'}", *extra]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


class _Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# ---------------------------------------------------------------------------------------------------------------
# Never unpickle
# ---------------------------------------------------------------------------------------------------------------


def test_payload_really_executes_when_unpickled(tmp_path):
    """Guards the tests below: the planted file is a live exploit (unpickled here on purpose, once)."""
    marker = tmp_path / "pwned"
    pickle.Unpickler(io.BytesIO(pickle.dumps(_Payload(marker)))).load()
    assert marker.exists()


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.safetensors", "rank-00000.safetensors",
                                    "checkpoint.json", "scorer/model.safetensors"])
def test_malicious_pickle_in_a_checkpoint_is_refused(stopped, tiny_data, tmp_path, capsys, victim):
    from foresight.cli import main

    out = _copy(stopped, tmp_path / "run")
    marker = tmp_path / "pwned"
    path = out / "checkpoints" / "step_000004" / victim
    path.write_bytes(pickle.dumps(_Payload(marker)))  # torch.save writes the same kind of pickle
    assert main(_cli(tiny_data, out, "--resume")) == 2
    err = _one_line_error(capsys)
    assert "--resume" in err and ("step_000004" in err), err
    assert not marker.exists()


def test_deepspeed_pickle_checkpoints_are_never_loaded(tiny_data, tmp_path, capsys):
    from foresight.cli import main

    out = tmp_path / "run"
    marker = tmp_path / "pwned"
    old = out / "checkpoints" / "step_000004"
    old.mkdir(parents=True)
    torch.save({"module": _Payload(marker)}, old / "mp_rank_00_model_states.pt")
    (out / "checkpoints" / "latest").write_text("step_000004")
    assert main(_cli(tiny_data, out, "--resume")) == 2
    assert "pickle format" in _one_line_error(capsys)
    assert not marker.exists()


_FORBIDDEN = [re.compile(p) for p in (
    r"weights_only\s*=\s*" + "False", r"\bpickle\s*\.\s*" + r"loads?\(", r"\btorch\s*\.\s*" + r"load\(",
    r"allow_pickle\s*=\s*" + "True", r"read_" + r"pickle\(", r"\bjoblib\s*\.\s*" + "load", r"\bdill\b",
    r"\bcloudpickle\b", r"\bmarshal\s*\.\s*" + "loads?")]


def test_no_unpickling_in_project_sources():
    """No project source may unpickle (outside the virtual environment and other dot-directories)."""
    hits = []
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if any(part.startswith(".") or part in ("build", "dist", "node_modules") for part in rel.parts):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(p.search(line) for p in _FORBIDDEN):
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "unpickling in project sources:\n" + "\n".join(hits)


# ---------------------------------------------------------------------------------------------------------------
# Refusals: no checkpoint, other settings, damaged files
# ---------------------------------------------------------------------------------------------------------------


def test_resume_without_checkpoint_is_a_one_line_error(tiny_data, tmp_path, capsys):
    from foresight.cli import main

    out = tmp_path / "empty"
    assert main(_cli(tiny_data, out, "--resume")) == 2
    err = _one_line_error(capsys)
    assert f"--resume: no checkpoint under {out / 'checkpoints'}" in err
    assert not (out / "features").exists()  # refused before any data preparation


def _files(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by relative path: what a refused run must leave as it was."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _no_model_load(monkeypatch) -> None:
    """A refusal must come before the model loads: loading it fails the test."""
    import training.loop

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(training.loop, "load_model", load_model)


@pytest.mark.parametrize("every", ["4", "0"])
def test_a_fresh_run_into_an_out_dir_with_checkpoints_is_refused(stopped, tiny_data, tmp_path, capsys,
                                                                 monkeypatch, every):
    """Kept, the earlier run's checkpoint (step 4) would be what a later --resume of the new run continues."""
    from foresight.cli import main

    out = _copy(stopped, tmp_path / "run")
    before = _files(out)
    _no_model_load(monkeypatch)
    assert main(_cli(tiny_data, out, "steps=2", f"checkpoint_every={every}")) == 2
    err = _one_line_error(capsys)
    assert f"out_dir {out} holds the checkpoints of an earlier run" in err and "pass --resume" in err, err
    assert _files(out) == before  # nothing written


@pytest.mark.parametrize("change, key, was, now", [
    ("hidden=8", "hidden", "16", "8"),
    ("lr=0.5", "lr", "0.01", "0.5"),
    ("feature_set=[key,value]", "feature_set", '["key", "value", "attn"]', '["key", "value"]'),
    ("steps=12", "steps", "8", "12"),
    ("seed=3", "seed", "0", "3"),
])
def test_resume_with_other_settings_names_the_keys(stopped, tiny_data, tmp_path, capsys, change, key, was, now):
    from foresight.cli import main

    out = _copy(stopped, tmp_path / "run")
    assert main(_cli(tiny_data, out, change, "--resume")) == 2
    err = _one_line_error(capsys)
    assert f"was trained with {key}={was}, this run asks {key}={now}; differing: {key}" in err, err


def test_resume_may_change_run_control_keys(stopped, tiny_data, tmp_path):
    from training.sl import run_sl

    out = _copy(stopped, tmp_path / "run")
    res = run_sl(_cfg(tiny_data, out, checkpoint_every=2, log_every=2, keep_checkpoints=1, max_steps_per_run=2),
                 resume=True)
    assert res["start"] == 4 and res["steps"] == 6


def test_resume_with_other_labels_content_is_refused(stopped, tiny_data, tmp_path, monkeypatch):
    """Same trace ids, same path-independent settings, different label values: refused as `labels`, before the
    model loads."""
    from golden.labels import load_labels, save_labels
    from training.sl import run_sl

    labels = load_labels(tiny_data[1])
    first = next(iter(labels.values()))
    first.events[0].alpha = first.events[0].alpha.flip(-1).contiguous()
    save_labels(tmp_path / "other.safetensors", list(labels.values()))
    out = _copy(stopped, tmp_path / "run")
    cfg = _cfg((tiny_data[0], tmp_path / "other.safetensors"), out, checkpoint_every=4,
               feature_cache=str(tmp_path / "features_other"))  # the feature cache also holds the targets
    with monkeypatch.context() as m, pytest.raises(ForesightError, match=r"differing: labels \("):
        _no_model_load(m)
        run_sl(cfg, resume=True)
    # a moved copy of the same labels is fine: identity is by content, not by path
    save_labels(tmp_path / "same.safetensors", list(load_labels(tiny_data[1]).values()))
    cfg = _cfg((tiny_data[0], tmp_path / "same.safetensors"), out, checkpoint_every=4)
    assert run_sl(cfg, resume=True)["finished"]


def test_resume_with_other_traces_is_refused_before_split_json_is_written(stopped, tiny_data, tmp_path, capsys,
                                                                          monkeypatch):
    """Other traces (here one fewer: another split) are refused as `traces` before the model loads, and the run's
    split.json, like every other file of the out_dir, stays the one its checkpoints were trained on."""
    import datasets

    from foresight.cli import main

    fewer = tmp_path / "fewer"
    datasets.load_from_disk(str(tiny_data[0])).select(range(5)).save_to_disk(str(fewer))
    capsys.readouterr()
    out = _copy(stopped, tmp_path / "run")
    before = _files(out)
    _no_model_load(monkeypatch)
    assert main(["train", "sl", *[a for a in _cli(tiny_data, out, "--resume")[2:] if not a.startswith("traces=")],
                 f"traces={fewer}"]) == 2
    assert "differing: labels, traces" in _one_line_error(capsys)
    assert _files(out) == before


def test_damaged_checkpoint_file_is_named(stopped, tiny_data, tmp_path):
    from training.sl import run_sl

    out = _copy(stopped, tmp_path / "run")
    victim = out / "checkpoints" / "step_000004" / "optimizer.safetensors"
    victim.write_bytes(victim.read_bytes()[:-5])
    with pytest.raises(ForesightError, match=re.escape(str(victim)) + ".*damaged"):
        run_sl(_cfg(tiny_data, out, checkpoint_every=4), resume=True)


# ---------------------------------------------------------------------------------------------------------------
# One run per out_dir (foresight/run_lock.py)
# ---------------------------------------------------------------------------------------------------------------


def _lock_is_free(out: Path) -> bool:
    from filelock import FileLock, Timeout

    from foresight.run_lock import lock_path

    lock = FileLock(str(lock_path(out)), blocking=False)
    try:
        lock.acquire()
    except Timeout:
        return False
    lock.release()
    return True


@pytest.mark.parametrize("extra", [[], ["--resume"], ["dagger_rounds=1"]])
def test_a_second_run_on_an_out_dir_in_use_is_refused_at_once(stopped, tiny_data, tmp_path, capsys, monkeypatch,
                                                              extra):
    """Two runs on one out_dir collided on its checkpoint temporaries (exit 1 in `.tmp-step_N`): the second is
    refused, one line naming the out_dir, before the model loads and without writing anything."""
    from foresight.cli import main

    out = _copy(stopped, tmp_path / "run") if extra == ["--resume"] else tmp_path / "run"
    before = _files(out) if out.exists() else None
    _no_model_load(monkeypatch)
    with run_in_progress(out):
        assert main(_cli(tiny_data, out, *extra)) == 2
    err = _one_line_error(capsys)
    assert f"out_dir {out} is in use by another training run" in err, err
    assert (_files(out) if out.exists() else None) == before
    assert not (tmp_path / "features").exists()  # refused before the data preparation


def test_the_lock_is_released_when_a_run_ends_or_dies(tiny_data, tmp_path, monkeypatch):
    """Held from start to end; free again after a time slice, a crash and the final run, and after its holder is
    killed (the operating system releases it): each next run on the out_dir goes on."""
    from foresight.cli import main
    from training.loop import StepSampler

    out = tmp_path / "run"
    with run_in_progress(out):
        pass  # killed: a run that died
    seen = []
    batch = StepSampler.batch

    def spy(self, step, rank):
        seen.append(_lock_is_free(out))
        if step == 5:
            raise RuntimeError("crash")
        return batch(self, step, rank)

    monkeypatch.setattr(StepSampler, "batch", spy)
    assert main(_cli(tiny_data, out, "max_steps_per_run=4")) == 0
    assert _lock_is_free(out) and seen == [False] * 4  # held by the run, released at its end
    assert main(_cli(tiny_data, out, "--resume")) == 1  # the crash at step 6: an internal error
    assert _lock_is_free(out)
    monkeypatch.setattr(StepSampler, "batch", batch)
    assert main(_cli(tiny_data, out, "--resume")) == 0
    assert json.loads((out / "summary.json").read_text())["finished"] and _lock_is_free(out)


def test_only_rank_0_takes_the_lock_and_it_is_reentrant(tmp_path):
    """The ranks of one run share its out_dir: a rank other than 0 never contends for the lock (rank 0 answers for
    the run); a process that holds it may enter again (run_sl around run_task)."""
    from training.distributed import DistInfo, out_dir_lock

    out = tmp_path / "run"
    with run_in_progress(out), out_dir_lock(out, DistInfo(1, 2, 1, torch.device("cpu"))):
        pass
    rank0 = DistInfo(0, 1, 0, torch.device("cpu"))
    with out_dir_lock(out, rank0), out_dir_lock(tmp_path / "." / "run", rank0):
        assert not _lock_is_free(out)
    assert _lock_is_free(out) and not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# Kills: metrics.jsonl, a kill during the final checkpoint write
# ---------------------------------------------------------------------------------------------------------------


def test_metrics_do_not_repeat_steps_after_a_kill(tiny_data, tmp_path, monkeypatch):
    from training.logging import read_metrics
    from training.sl import SLTask, run_sl

    run_sl(_cfg(tiny_data, tmp_path / "full"))
    full = read_metrics(tmp_path / "full" / "metrics.jsonl")
    orig = SLTask.loss

    def dies_at_6(self, model, items, step):
        if step == 5:  # steps 1..5 are logged, the newest checkpoint is step 4
            raise KeyboardInterrupt
        return orig(self, model, items, step)

    monkeypatch.setattr(SLTask, "loss", dies_at_6)
    with pytest.raises(KeyboardInterrupt):
        run_sl(_cfg(tiny_data, tmp_path / "part", checkpoint_every=4))
    with (tmp_path / "part" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "kind": "tr')  # and the kill tore a line
    monkeypatch.setattr(SLTask, "loss", orig)
    run_sl(_cfg(tiny_data, tmp_path / "part", checkpoint_every=4), resume=True)
    recs = read_metrics(tmp_path / "part" / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert [r["loss"] for r in train] == [r["loss"] for r in full if r["kind"] == "train"]
    assert [r["step"] for r in recs if r["kind"] == "eval"] == [8]


@pytest.mark.parametrize("dies_at", ["manifest", "latest"])
def test_kill_during_the_final_checkpoint_write_resumes_to_the_same_weights(tiny_data, tmp_path, dies_at):
    """A real process death (os._exit) while writing the step-8 checkpoint: before its manifest (the step-4
    checkpoint is used) or after its rename but before `latest` (the complete step-8 one is used)."""
    from training.sl import run_sl

    full = run_sl(_cfg(tiny_data, tmp_path / "full"))
    assert full["finished"]
    out = tmp_path / "run"
    target = ckpt.MANIFEST if dies_at == "manifest" else "latest"
    script = (
        "import os, sys\n"
        "from training import checkpoint as ckpt\n"
        "orig = ckpt.atomic_write_text\n"
        "def dying(path, text):\n"
        f"    if path.name == {target!r} and 'step_000008' in (str(path) + text):\n"
        "        os._exit(9)\n"
        "    orig(path, text)\n"
        "ckpt.atomic_write_text = dying\n"
        "from foresight.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # set by this process's own runs
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", script, *_cli(tiny_data, out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert not (out / "scorer").exists()
    start = 4 if dies_at == "manifest" else 8
    assert ckpt.latest_step(out) == start
    resumed = run_sl(_cfg(tiny_data, out, checkpoint_every=4), resume=True)
    assert resumed["finished"] and resumed["start"] == start
    a, b = _weights(tmp_path / "full" / "scorer"), _weights(out / "scorer")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-7, msg=k)
    assert not list((out / "checkpoints").glob(".tmp-*"))  # the next save cleaned the leftovers


# ---------------------------------------------------------------------------------------------------------------
# Units: state flattening and RNG round trips
# ---------------------------------------------------------------------------------------------------------------


def test_optimizer_state_round_trips_through_tensors_and_json():
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters(), lr=0.1, betas=(0.8, 0.95))
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    tensors, structure = state_io.flatten_state(opt.state_dict(), "opt")
    tensors = st_load(st_save(tensors))
    structure = json.loads(json.dumps(structure))
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.Adam(m2.parameters(), lr=0.5)
    opt2.load_state_dict(state_io.unflatten_state(structure, tensors))
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"] and b["param_groups"][0]["betas"] == (0.8, 0.95)
    for pid in a["state"]:
        for k, v in a["state"][pid].items():
            assert torch.equal(v, b["state"][pid][k])


def test_rng_state_round_trips():
    tensors, meta = state_io.rng_state()
    meta = json.loads(json.dumps(meta))
    want = (torch.rand(3), np.random.rand(3), random.random())
    state_io.set_rng_state(tensors, meta)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def test_settings_check_names_every_differing_key(tmp_path):
    saved = {"budget": 64, "interval": 16, "labels": "abc"}
    check_settings(saved, {"budget": 64}, tmp_path, complete=False)
    with pytest.raises(ForesightError) as exc:
        check_settings(saved, {"budget": 128, "interval": 16, "labels": "abd"}, tmp_path)
    assert "trained with budget=64, labels=abc, this run asks budget=128, labels=abd; differing: budget, labels" \
        in str(exc.value)


# ---------------------------------------------------------------------------------------------------------------
# Two ranks, ZeRO stage 2 (partitioned optimizer state, saved per rank)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_rank_zero2_resume_equals_uninterrupted(tiny_data, tmp_path):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))

    def launch(out: Path, *extra: str):
        args = [a for a in _cli(tiny_data, out, *extra) if not a.startswith("deepspeed=")]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29757",
               "-m", "foresight", *args, f"deepspeed={REPO / 'configs' / 'deepspeed' / 'zero2.json'}"]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    launch(tmp_path / "full")
    launch(tmp_path / "part", "max_steps_per_run=4")
    files = sorted(p.name for p in (tmp_path / "part" / "checkpoints" / "step_000004").iterdir())
    assert files == ["checkpoint.json", "model.safetensors", "rank-00000.safetensors", "rank-00001.safetensors",
                     "scorer"]
    assert "resumed from step 4" in launch(tmp_path / "part", "--resume").stdout
    a, b = _weights(tmp_path / "full" / "scorer"), _weights(tmp_path / "part" / "scorer")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-7, msg=k)



def test_grpo_resume_refuses_another_init_scorer_or_temperature(tiny_grpo, tmp_path, monkeypatch):
    """Refused before the task (the model's part: scorers loaded onto it, rollouts) is built."""
    import shutil

    import training.grpo
    from foresight.scorer import Scorer
    from tests.conftest import get_model
    from tests.training.test_grpo_train import _cfg as grpo_cfg
    from training.grpo import run_grpo

    root = tmp_path / "data"
    shutil.copytree(tiny_grpo, root)  # the fixture is shared: its scorer is changed below
    model, _ = get_model("tiny-llama")
    out = tmp_path / "run"
    run_grpo(grpo_cfg(root, out, checkpoint_every=2, max_steps_per_run=2, eval_before=False), model=model)

    def no_task(*args, **kwargs):
        raise AssertionError("the task was built before the refusal")

    monkeypatch.setattr(training.grpo, "GRPOTask", no_task)
    with pytest.raises(ForesightError, match=r"temperature=1\.0, this run asks temperature=0\.5; differing: temper"):
        run_grpo(grpo_cfg(root, out, checkpoint_every=2, temperature=0.5), resume=True, model=model)
    sc = Scorer.from_pretrained(root / "scorer")
    with torch.no_grad():
        next(sc.parameters()).add_(0.1)
    sc.save_pretrained(root / "scorer")  # same path, other weights
    with pytest.raises(ForesightError, match=r"differing: init_scorer, ref_scorer"):
        run_grpo(grpo_cfg(root, out, checkpoint_every=2), resume=True, model=model)


def test_resume_settings_record_the_dtype_a_null_dtype_resolves_to(monkeypatch, tmp_path):
    """``dtype: null`` loads bf16 on a GPU and fp32 on a CPU: a GPU run resumed on a CPU is refused, naming it;
    CPU settings are what they always were (no key), so earlier CPU checkpoints resume."""
    from foresight import models
    from training.grpo_config import GRPOConfig
    from training.trainer_config import resume_settings

    monkeypatch.setattr(models, "default_dtype", lambda d: torch.bfloat16 if d.type == "cuda" else torch.float32)
    cfg = GRPOConfig.from_dict({"model": "smollm2-135m", "traces": "t", "init_scorer": "s",
                                "out_dir": str(tmp_path / "o")})
    on_cpu, on_gpu = (resume_settings(cfg, 1, {}, device=d) for d in ("cpu", "cuda"))
    assert "weights_dtype" not in on_cpu and on_gpu["weights_dtype"] == "bfloat16"
    assert on_cpu == resume_settings(cfg, 1, {})
    with pytest.raises(ForesightError, match=r"weights_dtype=bfloat16.*weights_dtype=\(unset\)"):
        check_settings(on_gpu, on_cpu, tmp_path)
    tiny = GRPOConfig.from_dict({"model": "tiny-llama", "traces": "t", "init_scorer": "s"})
    assert "weights_dtype" not in resume_settings(tiny, 1, {}, device="cuda")  # tiny models are always fp32


def test_one_rule_names_the_weights_dtype_for_resume_settings_and_the_fingerprint_side():
    """resume_settings' `weights_dtype` and fingerprint.weights_dtype's `dtype` name a precision the same way (one
    helper): nothing for float32, the bare torch name otherwise."""
    from foresight.fingerprint import dtype_name, weights_dtype
    from training.grpo_config import GRPOConfig
    from training.trainer_config import resume_settings

    assert dtype_name(torch.float32) is None and weights_dtype(torch.nn.Linear(2, 2)) == {}
    cfg = GRPOConfig.from_dict({"model": "smollm2-135m", "traces": "t", "init_scorer": "s", "dtype": "float32"})
    assert "weights_dtype" not in resume_settings(cfg, 1, {}, device="cpu")
    for dtype in (torch.bfloat16, torch.float16):
        cfg = GRPOConfig.from_dict({"model": "smollm2-135m", "traces": "t", "init_scorer": "s",
                                    "dtype": str(dtype).removeprefix("torch.")})
        named = resume_settings(cfg, 1, {}, device="cpu")["weights_dtype"]
        assert named == dtype_name(dtype) == weights_dtype(torch.nn.Linear(2, 2).to(dtype))["dtype"]


def test_all_reduce_sends_cpu_tensors_through_the_gpu_under_nccl(monkeypatch):
    """NCCL reduces CUDA tensors only: the loop's CPU flags and loss go through a copy on the rank's device and
    come back reduced in place; under gloo the tensor itself is reduced."""
    import torch.distributed as tdist

    from training import distributed as D

    seen = []

    def fake_reduce(t, op=None):
        seen.append(t)
        t.mul_(2)  # two ranks holding the same value, summed

    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    monkeypatch.setattr(tdist, "get_world_size", lambda: 2)
    monkeypatch.setattr(tdist, "all_reduce", fake_reduce)
    monkeypatch.setattr(D, "_nccl_device", lambda: torch.device("cpu"))  # stands for cuda:<local rank>
    for backend, through_copy in (("nccl", True), ("gloo", False)):
        monkeypatch.setattr(tdist, "get_backend", lambda b=backend: b)
        seen.clear()
        v = torch.tensor([1.5])
        assert D.all_reduce(v, "sum") is v and float(v) == 3.0
        assert len(seen) == 1 and (seen[0] is not v) == through_copy
