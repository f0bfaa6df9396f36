"""The foresight command line: subcommands, JSON output, errors without tracebacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from foresight.cli import build_parser, main
from foresight.cli.args import parse_policy_args
from foresight.errors import ForesightError


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


def test_hub_retry_warnings_stay_off_stderr(tmp_path):
    """A --data that is no built-in name or file is tried on the Hub: offline, huggingface_hub logged a warning per
    retry (a dozen lines before the error); now the error is the one line. A subprocess: pytest's log capture would
    hide the warnings."""
    script = f"""
import sys, datasets
from huggingface_hub.utils import logging as hub_logging
from foresight.cli import main

def unreachable(*args, **kwargs):
    for n in range(1, 3):
        hub_logging.get_logger("huggingface_hub.utils._http").warning(f"Retrying in {{n}}s [Retry {{n}}/5].")
    raise ConnectionError("Couldn't reach 'aime2024' on the Hub")

datasets.load_dataset = unreachable
sys.exit(main(["trace", "--model", "tiny-llama", "--data", "aime2024", "--out", {str(tmp_path / "t")!r}]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "could not load problems 'aime2024'" in proc.stderr and not (tmp_path / "t").exists()


# --- the one --policy-arg grammar: [POLICY.]KEY=VALUE ------------------------------------------------------------


def test_policy_arg_grammar_one_policy_prefix_optional(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("seed: 1\nselection: topk\n")
    got = parse_policy_args(["seed=3", "learned.temperature=2e-4", "scorer=runs/a.b/scorer"], ["learned"], str(cfg))
    assert got == {"learned": {"seed": 3, "selection": "topk", "temperature": 2e-4, "scorer": "runs/a.b/scorer"}}


def test_policy_arg_grammar_several_policies_prefix_required():
    assert parse_policy_args(["random.seed=3"], ["full", "random"]) == {"full": {}, "random": {"seed": 3}}
    for item, message in (("seed=3", "name one: POLICY.seed=VALUE"), ("h2o.seed=3", "policy 'h2o' is not in play"),
                          ("random.seed", "expected [POLICY.]KEY=VALUE"), ("random.=3", "expected [POLICY.]KEY=VALUE")):
        with pytest.raises(ForesightError, match=re.escape(message)) as err:
            parse_policy_args([item], ["full", "random"])
        assert repr(item) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ForesightError, match="--policy-config applies to one policy"):
        parse_policy_args([], ["full", "random"], "p.yaml")


def test_every_command_declares_the_policy_and_cache_arguments_the_same_way():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices
    ev = sub["eval"]._subparsers._group_actions[0].choices
    parsers = {"generate": sub["generate"], "bench": sub["bench"], "eval fidelity": ev["fidelity"],
               "eval aime": ev["aime"], "golden": sub["golden"]}
    for name, p in parsers.items():
        acts = {a.dest: a for a in p._actions}
        assert acts["budget"].metavar in ("B", "B[,B...]"), name
        assert acts["interval"].metavar == "W", name
        if name != "golden":
            assert acts["sinks"].default == 0 and acts["policy_arg"].metavar == "[POLICY.]KEY=VALUE", name
    # the shared defaults (CacheConfig's): no budget = the full cache, W = B // 4
    for name in ("generate", "eval aime"):
        acts = {a.dest: a for a in parsers[name]._actions}
        assert acts["budget"].default is None and acts["interval"].default is None, name


@pytest.mark.parametrize("argv, named", [
    (["generate", "--prompt", "x", "--policy", "paged", "--budget", "16", "--interval", "4", "--policy-arg",
      "block_size=3"], "block_size (3) must divide the interval W (4)"),
    (["generate", "--prompt", "x", "--policy", "h2o", "--budget", "16", "--interval", "4", "--sinks", "13"],
     "--budget/--interval/--sinks: sinks must be in [0, budget - interval], got 13"),
    (["bench", "--budget", "16", "--interval", "4", "--policies", "paged", "--policy-arg", "paged.block_size=3"],
     "block_size (3) must divide the interval W (4)"),
    (["bench", "--budget", "16", "--interval", "4", "--policies", "h2o", "--policy-arg", "h2o.bogus=1"],
     "policy 'h2o' has no hyperparameter(s) bogus"),
    # full is always measured, but was built without its arguments: full.x=1 was ignored and the run went on
    (["bench", "--budget", "16", "--interval", "4", "--policies", "h2o", "--policy-arg", "full.x=1"],
     "policy 'full' has no hyperparameter(s) x"),
], ids=["generate-paged-block", "generate-sinks", "bench-paged-block", "bench-unknown-key", "bench-full-arg"])
def test_policy_and_cache_settings_are_refused_before_the_model_loads(argv, named, capsys, monkeypatch):
    import foresight

    monkeypatch.setattr(foresight, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert main([argv[0], "--model", "tiny-llama", *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and named in err, err


def test_generate_refuses_a_policy_arg_for_another_policy(capsys):
    assert main(["generate", "--model", "tiny-llama", "--prompt", "x", "--policy", "random", "--budget", "16",
                 "--policy-arg", "h2o.seed=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("foresight generate: error:") and "'h2o.seed=3'" in err and "\n" not in err
