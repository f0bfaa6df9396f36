"""The README is the product page: a few screens, its links resolve, its headline table is the generated one, every
snippet in it runs (the slow suite, on the default model), and the product holds no history of how it was made."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()

#: Work-period numbering ("session 28's scorer", "sessions 11-12") in the product: history belongs in git.
HISTORY = re.compile(r"\b[Ss]essions? \d+|\bwork period\b|\bwe tried\b")
#: Tracked files that are the product (README, docs, code, configs, model cards, benchmark tools).
PRODUCT = ("README.md", "docs/", "foresight/", "golden/", "training/", "evaluation/", "configs/", "benchmarks/",
           "Makefile", "pyproject.toml")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_is_a_few_screens():
    assert len(README.splitlines()) <= 300


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link.split("#")[0] for link in links if not link.startswith(("http://", "https://", "#"))]
    assert local, "the README links to its docs"
    missing = sorted({p for p in local if not (REPO / p).exists()})
    assert not missing, f"README.md links to missing files: {missing}"


def test_no_history_in_the_product():
    files = subprocess.run(["git", "ls-files", *PRODUCT], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for name in files:
        if name.startswith("foresight/problem_sets/") or name.endswith((".safetensors", ".png", ".onnx")):
            continue
        text = (REPO / name).read_text(errors="replace")
        hits += [f"{name}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}" for m in HISTORY.finditer(text)]
    assert not hits, "history in the product (it belongs in git and CHANGELOG.md):\n" + "\n".join(hits[:20])


def test_history_grep_finds_what_it_must():
    for text in ("session 28's scorer", "sessions 11-12's recipe", "Session 40"):
        assert HISTORY.search(text)
    assert not HISTORY.search("a session's time; one decoding session")


def test_results_table_and_page_are_the_generated_ones():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_python_quickstart_runs_and_evicts(capsys):
    (snippet,) = _blocks("python")
    assert len(snippet.strip().splitlines()) <= 10
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    printed = capsys.readouterr().out
    completion = scope["tok"].decode(scope["out"][0, scope["ids"]["input_ids"].shape[1]:], skip_special_tokens=True)
    assert completion.strip() and completion.strip() in printed
    assert scope["stats"]["evictions"] >= 1 and max(scope["stats"]["peak_entries"]) <= 64 + 16


def _commands(block: str) -> list[list[str]]:
    joined = block.replace("\\\n", " ")
    lines = [line.split("#", 1)[0].strip() for line in joined.splitlines()]
    return [shlex.split(line) for line in lines if line]


@pytest.mark.slow
def test_shell_snippets_run_as_written(tmp_path):
    """Every shell block but the set-up (which CI itself runs, `make venv`) runs command by command, in a fresh
    directory beside the repository's configs, with ``foresight`` the installed command line."""
    blocks = [b for b in _blocks("bash") if "make venv" not in b]
    assert len(blocks) >= 2
    (tmp_path / "configs").symlink_to(REPO / "configs")
    # a fresh shell's environment: no rendezvous left behind by in-process training tests (their MASTER_PORT is
    # still held by this process's process group)
    launch = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in launch}, "PYTHONPATH": str(REPO)}
    for block in blocks:
        for cmd in _commands(block):
            assert cmd[0] == "foresight", cmd
            proc = subprocess.run([sys.executable, "-m", "foresight", *cmd[1:]], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stderr[-2000:]}"
    assert (tmp_path / "runs/qs/scorer/config.json").exists()
