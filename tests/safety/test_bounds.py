"""Bounds before work (foresight/limits.py, the YAML reader, the rendezvous): an input past the model's context, the
data, the memory or the plan size is refused in one line, exit 2, before the work starts and before anything is
written; what used to hang forever is run here in a subprocess with a time limit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from foresight.cli import main
from foresight.errors import ForesightError
from tests.training.test_grpo_train import tiny_grpo  # noqa: F401  (a fixture)
from training.distributed import _free_port

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny-llama"]
CONTEXT = 4096  # the tiny models' max_position_embeddings


def _foresight(*argv: str, env: dict | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    """``foresight ARGV`` in a subprocess: a hang fails the test at ``timeout`` seconds, not the whole suite."""
    return subprocess.run([sys.executable, "-m", "foresight", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_prompt_past_the_models_context_is_refused(capsys):
    assert main(["generate", *TINY, "--prompt", "x" * (CONTEXT + 10), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert f"more than the model's context of {CONTEXT:,} positions" in _one_line(err)


def test_max_new_tokens_past_the_context_is_refused_before_generating():
    out = _foresight("bench", *TINY, "--budget", "16", "--new-tokens", "100000000", "--repeats", "1", timeout=300)
    assert out.returncode == 2, out.stderr
    err = _one_line(out.stderr)
    assert "+ --new-tokens 100,000,000" in err and f"context of {CONTEXT:,} positions" in err, err
    assert err.endswith(f"pass --new-tokens {CONTEXT - 155} or less")  # the default prompt is 155 byte tokens


def test_traces_past_the_models_context_are_refused(tmp_path, tiny_llama, capsys):
    from tests.conftest import save_random_traces

    traces = tmp_path / "traces"
    save_random_traces(tiny_llama[0], traces, [60, CONTEXT + 5])
    capsys.readouterr()
    for argv in (["eval", "fidelity", *TINY, "--traces", str(traces), "--policies", "full,random", "--budget", "16",
                  "--interval", "4", "--quiet", "--out", str(tmp_path / "out")],
                 ["golden", *TINY, "--traces", str(traces), "--budget", "16", "--interval", "4", "--no-progress",
                  "--out", str(tmp_path / "out")]):
        assert main(argv) == 2
        err = _one_line(capsys.readouterr().err)
        assert f"the longest trace of {'--traces ' if argv[0] == 'eval' else ''}{traces} = {CONTEXT + 5:,} tokens" \
            in err, err
        assert not (tmp_path / "out").exists()
    from foresight.runtime import replay

    with pytest.raises(ForesightError, match=f"the longest sequence replayed = {CONTEXT + 5:,} tokens"):
        replay(tiny_llama[0], [list(range(3, 3 + CONTEXT + 5))])  # the engine's own check, for library callers


def test_a_huge_limit_is_refused(tmp_path):
    """`--limit 10^22` on the synthetic set generated problems forever."""
    out = _foresight("trace", *TINY, "--data", "synthetic", "--limit", str(10**22), "--out", str(tmp_path / "tr"))
    assert out.returncode == 2, out.stderr
    assert f"--limit {10**22}: the synthetic set has at most 100,000 problems" in _one_line(out.stderr)
    assert not (tmp_path / "tr").exists()


def test_first_sample_past_the_int32_column_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """`trace --first-sample 2^63-1` failed after the model load without naming the flag, leaving a plan.json that
    blocked the corrected command."""
    import foresight

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(foresight, "load_model", no_load)
    out = tmp_path / "tr"
    for argv in (["--first-sample", str(2**63 - 1)], ["--samples", str(10**7), "--limit", "1000"]):
        assert main(["trace", *TINY, "--data", "synthetic", "--limit", "2", "--out", str(out), *argv]) == 2
        err = _one_line(capsys.readouterr().err)
        assert argv[0] in err, err
        assert not out.exists()


def test_a_yaml_alias_bomb_is_refused(tmp_path):
    """Nine nested aliases (9^9 values once expanded) hung the reader of the config's error message."""
    from foresight.config import read_yaml_mapping

    levels = "abcdefghi"
    text = f'{levels[0]}: &{levels[0]} ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    text += "".join(f"{x}: &{x} [{', '.join([f'*{p}'] * 9)}]\n" for p, x in zip(levels, levels[1:]))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(text.replace("i: &i", "fidelity_policies: &i"))
    with pytest.raises(ForesightError, match="expands to more than 100,000 values"):
        read_yaml_mapping(bomb)
    out = _foresight("train", "sl", "--config", str(bomb), timeout=120)
    assert out.returncode == 2, out.stderr
    assert "expands to more than 100,000 values" in _one_line(out.stderr)
    big = tmp_path / "big.yaml"
    big.write_text("steps: 1\n" + "# padding\n" * 200_000)
    with pytest.raises(ForesightError, match="more than the 1,048,576 a config may hold"):
        read_yaml_mapping(big)


def test_a_rank_that_no_other_joins_is_refused_in_bounded_time(tmp_path):
    """`RANK=0 WORLD_SIZE=2` with no second rank waited forever for it."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "FORESIGHT_RENDEZVOUS_TIMEOUT": "5", "DS_ACCELERATOR": "cpu"}
    out = _foresight("train", "sl", "--config", "configs/sl.yaml", "model=tiny-llama", f"traces={tmp_path / 't'}",
                     f"labels={tmp_path / 'l'}", f"out_dir={tmp_path / 'run'}", "device=cpu", env=env, timeout=240)
    assert out.returncode == 2, out.stderr
    err = _one_line(out.stderr)
    assert "RANK=0 WORLD_SIZE=2" in err and "within 5 s" in err and "FORESIGHT_RENDEZVOUS_TIMEOUT" in err, err
    assert not (tmp_path / "run").exists()
    bad = _foresight("train", "sl", "--config", "configs/sl.yaml", env={**env, "FORESIGHT_RENDEZVOUS_TIMEOUT": "x"})
    assert bad.returncode == 2 and "FORESIGHT_RENDEZVOUS_TIMEOUT='x'" in _one_line(bad.stderr)


def test_a_micro_batch_past_the_memory_is_refused_before_training(tmp_path):
    """`micro_batch=10^9` hung (a permutation of 10^9 indices, then the step)."""
    from tests.training.test_sl import _cfg, _make_data
    from training.sl import run_sl

    data = _make_data(tmp_path / "data", n=4)
    with pytest.raises(ForesightError, match=r"micro_batch=1000000000 needs about [\d,.]+ [GT]iB of memory"):
        run_sl(_cfg(data, tmp_path / "run", micro_batch=10**9))
    assert not (tmp_path / "features").exists()  # refused before the features were extracted


def test_a_group_size_past_the_memory_is_refused_before_training(tiny_grpo, tmp_path):
    """`group_size=10^6` hung in the first step's rollouts."""
    from tests.training.test_grpo_train import _cfg
    from training.grpo import run_grpo

    with pytest.raises(ForesightError, match=r"micro_batch=1 x group_size=1000000 needs about [\d,.]+ [GT]iB"):
        run_grpo(_cfg(tiny_grpo, tmp_path / "run", group_size=10**6))
