"""The ``foresight`` command line: the entry point and the command registry (the library's top floor).

* :func:`main` / :func:`build_parser` (here): the entry point (``foresight = "foresight.cli:main"``,
  ``python -m foresight``);
* the commands: the library's own (:mod:`foresight.cli.commands`: ``generate``, ``policies``, ``launch``), found
  there, and those of the packages above it (``trace`` and ``golden`` from :mod:`golden.cli`; ``eval``, ``bench``
  and ``export`` from :mod:`evaluation.cli`; ``train`` and ``demo`` from :mod:`training.cli`), declared as
  ``foresight.commands`` entry points (:mod:`foresight.plugins`). A command module defines ``register(subparsers)``,
  which adds its parser and sets ``func`` (a callable taking the parsed args and returning an exit code). Arguments
  several commands share (model, cache B/W/sinks, policy and ``--policy-arg``) are declared once in
  :mod:`foresight.cli.args`.

The arguments are parsed first: command modules import the heavy libraries (torch, transformers, the training and
evaluation stacks) inside their ``run`` functions, not at the top of the module, so that ``foresight --help`` and
a usage error answer without loading them (``tests/cli/test_cli.py``).

Launchers: ``torchrun -m foresight ...`` and ``foresight launch`` hand each rank its place in the environment;
DeepSpeed's launcher (``deepspeed --module foresight ...``) also puts ``--local_rank=N`` right after the module
name, which the top-level parser accepts (and checks against ``LOCAL_RANK``).

Exit status: 0 success; 2 an error the user can fix (bad arguments, config values, missing or damaged input
files, a full disk or an exhausted memory: :func:`foresight.errors.machine_limit`), printed as one line
``foresight <command>: error: ...`` that names the offending file, key, value or size; 1 an unexpected internal
error, also one line (``--verbose`` shows the traceback), or a command whose plugin fails to import; 130 interrupted. A command with ``--out`` holds that
directory's lock while it runs (:mod:`foresight.run_lock`; see docs/reliability.md).
A command that refuses its input refuses it before loading a model or writing anything.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import logging
import os
import pkgutil
import sys

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from typing import Callable

from foresight import plugins
from foresight.config import nonnegative_int
from foresight.errors import ForesightError, OneLineParser, machine_limit

UserError = ForesightError  # raised by commands for input the user can fix; printed without a traceback
ERROR_DIR = "FORESIGHT_ERROR_DIR"  # set by `foresight launch` for its ranks: where :func:`report` writes their errors


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="foresight",
        description="foresightkv: learned KV-cache eviction for long LLM reasoning.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="show library logs and tracebacks")
    # DeepSpeed's launcher passes --local_rank=N before the command (`deepspeed --module foresight train ...`)
    parser.add_argument("--local_rank", "--local-rank", type=nonnegative_int, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _, register in sorted(registered_commands().items()):
        register(sub)
    return parser


def registered_commands() -> dict[str, Callable]:
    """``{name: register}`` of every command: the library's own modules and the ``foresight.commands`` plugins. A
    plugin that fails to import still gets its name on the command line, where running it reports the error."""
    import foresight.cli.commands as builtin

    found = {m.name: importlib.import_module(f"{builtin.__name__}.{m.name}").register
             for m in pkgutil.iter_modules(builtin.__path__) if not m.name.startswith("_")}
    for name, ep in plugins.plugins(plugins.COMMANDS).items():
        if name in found:
            raise plugins.PluginError(f"{plugins.COMMANDS} {name!r} ({ep.value}) would replace a built-in command")
        try:
            found[name] = plugins.load(ep, plugins.COMMANDS)
        except plugins.PluginError as exc:
            found[name] = _unavailable(name, exc)
    return found


def _unavailable(name: str, error: plugins.PluginError) -> Callable:
    """``register`` of a command whose plugin failed to import: the command takes any arguments and reports the
    import error in one line (exit status 1; ``--verbose`` raises it with its traceback)."""
    def run(args) -> int:
        if args.verbose:
            raise error
        report(f"foresight {name}: error: {_one_line(error)}")
        return 1

    def register(sub) -> None:
        p = sub.add_parser(name, help="(failed to load: run it for the error)", add_help=False)
        p.set_defaults(func=run, plugin_error=error)  # its arguments are not parsed (:func:`_parse`)

    return register


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
    except Exception as exc:  # a broken installation: one line, the traceback behind --verbose
        if "--verbose" in raw or "-v" in raw:
            raise
        report(f"foresight: internal error while loading the commands: {type(exc).__name__}: {_one_line(exc)}")
        return 1
    args = _parse(parser, raw)
    if isinstance(args, int):
        return args
    if args.local_rank is not None:  # DeepSpeed's launcher: LOCAL_RANK is set too, and must agree
        if os.environ.setdefault("LOCAL_RANK", str(args.local_rank)) != str(args.local_rank):
            report(f"foresight: error: --local_rank={args.local_rank} but LOCAL_RANK={os.environ['LOCAL_RANK']} in "
                   "the environment; start the command through one launcher")
            return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    if not args.verbose:
        from huggingface_hub.utils import logging as hub_logging
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hub_logging.set_verbosity_error()  # its per-retry warnings of an unreachable Hub (a --data or --model typo)
        hf_logging.disable_progress_bar()
        logging.getLogger("deepspeed").setLevel(logging.WARNING)
    try:
        with _out_lock(args):
            return int(args.func(args) or 0)
    except (ForesightError, ValueError, FileNotFoundError, OSError) as exc:
        if args.verbose:
            raise
        why = _one_line(exc) if isinstance(exc, ForesightError) else machine_limit(exc) or _one_line(exc)
        report(f"foresight {args.command}: error: {why}")
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not the user's input: still one line, the traceback behind --verbose
        if args.verbose:
            raise
        limit = machine_limit(exc)  # a full disk or memory, whichever library met it: the user can act on it
        if limit:
            report(f"foresight {args.command}: error: {limit}")
            return 2
        report(f"foresight {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)} "
               "(rerun with --verbose for the traceback)")
        return 1


def _out_lock(args):
    """The lock of the command's ``--out`` (:mod:`foresight.run_lock`), held while the command runs: one writer per
    output directory. Rank 0 of a launched command takes it; a name that is no output directory of its own (empty,
    the current directory, a symbolic link ...) is refused first, before a lock file is made beside it."""
    from foresight.output_paths import check_output_dir
    from foresight.run_lock import locked_out_dir

    out = getattr(args, "out", None)
    if not isinstance(out, str):
        return contextlib.nullcontext()
    check_output_dir(out, "--out")
    return locked_out_dir(out, "--out", what=f"`foresight {args.command}` run",
                          is_main=os.environ.get("RANK", "0").strip() in ("", "0"))


def _parse(parser: argparse.ArgumentParser, raw: list[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of ``--help`` (0) or of a usage error already printed (2)."""
    try:
        args, extra = parser.parse_known_args(raw)
        if extra and getattr(args, "plugin_error", None) is None:  # `train sl lr=0.1 --config x.yaml steps=5`: overrides on both sides of the options
            if isinstance(getattr(args, "overrides", None), list) and all("=" in x and not x.startswith("-")
                                                                          for x in extra):
                args.overrides += extra
            else:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
    return args


def parse_command(raw: list[str]) -> int | None:
    """Check ``raw`` (a command line after ``foresight``) as :func:`main` would parse it: None when it parses to a
    command, else the exit status (its usage error printed as one line; ``--help`` printed, 0)."""
    args = _parse(build_parser(), raw)
    if isinstance(args, int):
        return args
    if not getattr(args, "func", None):
        print(f"foresight: error: no command in {' '.join(raw)!r}", file=sys.stderr)
        return 2
    return None


def report(line: str) -> None:
    """Print an error line on stderr. In a rank started by ``foresight launch`` (``FORESIGHT_ERROR_DIR`` set) it is
    also recorded in the launcher's error directory (one file per rank, which gives the launcher its exit status),
    and printed by the first rank that meets it only, so a refusal that every rank meets is one line, not one per
    rank."""
    where = os.environ.get(ERROR_DIR)
    if where and os.path.isdir(where):
        with open(os.path.join(where, f"rank-{int(os.environ.get('RANK', '0'))}.txt"), "a") as f:
            f.write(line + "\n")
        if not _first_to_say(where, line):
            return
    print(line, file=sys.stderr)


def _first_to_say(where: str, line: str) -> bool:
    """Whether this process is the first to say ``line`` in the error directory ``where`` (an exclusive create)."""
    try:
        os.close(os.open(os.path.join(where, f"said-{hashlib.sha256(line.encode()).hexdigest()[:16]}"),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
