"""The foresight command line: subcommands, JSON output, errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

from foresight.cli import main


def test_help_lists_subcommands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for cmd in ("generate", "policies"):
        assert cmd in out


def test_policies_json(capsys):
    assert main(["policies", "--json"]) == 0
    names = json.loads(capsys.readouterr().out)
    assert isinstance(names, list) and {"full", "random", "streaming_llm"} <= set(names)


def test_generate_json(capsys):
    rc = main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--policy", "streaming_llm",
               "--budget", "16", "--interval", "4", "--max-new-tokens", "40", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"][0]) <= 40
    assert max(out["stats"]["peak_entries"]) <= 20


def test_bad_input_is_one_line_error():
    for args in (
        ["generate", "--model", "tiny-llama", "--prompt", "x", "--policy", "nope", "--budget", "8"],
        ["generate", "--model", "tiny-llama", "--prompt", "x", "--policy", "random", "--budget", "0"],
        ["generate", "--model", "tiny-llama", "--prompt", "x", "--policy", "random", "--budget", "8", "--interval", "9"],
        ["generate", "--model", "nonexistent-model", "--prompt", "x"],
    ):
        proc = subprocess.run([sys.executable, "-m", "foresight", *args], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.strip().startswith("foresight generate: error:")
