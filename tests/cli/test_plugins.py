"""The library's registries and their plugins: commands and policies of the packages above it come from entry points,
the library imports none of them, and ``foresight --help`` loads neither torch nor transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from foresight import plugins
from foresight.cli import main
from foresight.policies import POLICIES, make_policy, policy_names

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "sklearn", "deepspeed", "golden.policy", "training.sl", "evaluation.fidelity")


def _imported_after(code: str) -> list[str]:
    """The modules of ``HEAVY`` and the packages above the library that a fresh interpreter holds after ``code``."""
    probe = (f"import sys\n{code}\nprint(__import__('json').dumps(sorted(m for m in sys.modules if m in {HEAVY!r} "
             "or m.split('.')[0] in ('golden', 'training', 'evaluation'))))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_import_foresight_imports_no_package_above_it_nor_torch():
    assert _imported_after("import foresight") == []


def test_parsing_help_imports_no_heavy_library():
    code = ("from foresight.cli import build_parser, main\nbuild_parser()\n"
            "import contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()):\n    assert main(['--help']) == 0\n"
            "    assert main(['train', 'sl', '--help']) == 0\n    assert main(['eval', 'fidelity', '--help']) == 0")
    loaded = _imported_after(code)
    assert not [m for m in loaded if m in HEAVY], loaded  # the command modules of golden/... are light, and allowed


def test_the_public_api_still_resolves_by_name():
    import foresight

    assert foresight.BudgetedCache.__name__ == "BudgetedCache" and callable(foresight.load_model)
    assert foresight.models.cache_dir is not None  # a submodule by attribute, as before
    with pytest.raises(AttributeError):
        foresight.no_such_name


def test_installed_entry_points_are_the_ones_pyproject_declares():
    """A stale install (metadata from before a command was added) would hide commands: this says so."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    for group in (plugins.COMMANDS, plugins.POLICIES):
        installed = {name: ep.value for name, ep in plugins.plugins(group).items()}
        assert installed == declared[group], f"reinstall (pip install -e .): {group} differs"
        for name, ep in plugins.plugins(group).items():
            assert callable(plugins.load(ep, group)), name


def test_golden_policy_comes_from_its_entry_point():
    assert "golden" in POLICIES and "golden" in policy_names()
    from golden.policy import GoldenPolicy

    assert POLICIES["golden"] is GoldenPolicy
    with pytest.raises(ValueError, match="needs labels"):
        make_policy("golden")


def _broken(group: str, name: str = "broken") -> dict:
    return {name: EntryPoint(name, "no_such_package.module:thing", group)}


def test_a_command_plugin_that_fails_to_import_is_one_line_and_the_others_work(monkeypatch, capsys):
    real = plugins.plugins
    monkeypatch.setattr(plugins, "plugins", lambda g: {**real(g), **_broken(g)} if g == plugins.COMMANDS else real(g))
    assert main(["--help"]) == 0 and "broken" in capsys.readouterr().out
    assert main(["broken", "--any", "args"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("foresight broken: error: foresight.commands 'broken' "
                                                   "(no_such_package.module:thing) failed to import: "
                                                   "ModuleNotFoundError"), err
    assert main(["policies", "--json"]) == 0 and "golden" in json.loads(capsys.readouterr().out)


def test_a_policy_plugin_that_fails_to_import_is_one_line(monkeypatch):
    real = plugins.plugins
    monkeypatch.setattr(plugins, "plugins", lambda g: {**real(g), **_broken(g, "nope")} if g == plugins.POLICIES
                        else real(g))
    assert "nope" in policy_names()  # listed by name without importing it
    with pytest.raises(plugins.PluginError, match=r"^foresight.policies 'nope' \(no_such_package.module:thing\) "
                                                  r"failed to import: ModuleNotFoundError") as err:
        make_policy("nope")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag", ["--local_rank=1", "--local-rank=1"])
def test_deepspeeds_local_rank_before_the_command_is_accepted(flag, monkeypatch, capsys):
    """``deepspeed --module foresight train ...`` runs ``python -m foresight --local_rank=N train ...`` per rank."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert main([flag, "policies", "--json"]) == 0
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert main([flag, "policies", "--json"]) == 2
    assert capsys.readouterr().err.strip().endswith("LOCAL_RANK=0 in the environment; start the command through "
                                                    "one launcher")
    from foresight.cli import build_parser

    for trainer in ("sl", "grpo", "adapt", "e2e"):
        args = build_parser().parse_args([flag, "train", trainer, "--config", "x.yaml", "steps=2"])
        assert (args.local_rank, args.trainer, args.overrides) == (1, trainer, ["steps=2"])
