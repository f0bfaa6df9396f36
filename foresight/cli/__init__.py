"""The top floor of the house: the ``foresight`` command line and the end-to-end demo, on top of the library.

* :func:`main` / :func:`build_parser` (here): the entry point (``foresight = "foresight.cli:main"``,
  ``python -m foresight``);
* :mod:`foresight.cli.commands`: one module per subcommand. A command module defines ``register(subparsers)``,
  which adds its parser and sets ``func`` (a callable taking the parsed args and returning an exit code); modules
  are discovered automatically. Arguments several commands share (model, cache B/W/sinks, policy and
  ``--policy-arg``) are declared once in :mod:`foresight.cli.commands._common`;
* :mod:`foresight.cli.demo`: the pipeline that ``foresight demo`` / ``make demo`` runs.

Nothing below this package imports it (``tests/test_import_graph.py``). Command modules import the heavy
libraries (torch, transformers, the training and evaluation stacks) inside their ``run`` functions, not at the top
of the module, so that ``foresight --help`` and a usage error answer without loading them.

Exit status: 0 success; 2 an error the user can fix (bad arguments, config values, missing or damaged input
files, a full disk or an exhausted memory: :func:`foresight.errors.machine_limit`), printed as one line
``foresight <command>: error: ...`` that names the offending file, key, value or size; 1 an unexpected internal
error, also one line (``--verbose`` shows the traceback); 130 interrupted. A command with ``--out`` holds that
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


import golden  # noqa: F401  (registers the "golden" policy)
from foresight.errors import ForesightError, OneLineParser, machine_limit

UserError = ForesightError  # raised by commands for input the user can fix; printed without a traceback
ERROR_DIR = "FORESIGHT_ERROR_DIR"  # set by `foresight launch` for its ranks: where :func:`report` writes their errors


def build_parser() -> argparse.ArgumentParser:
    import foresight.cli.commands as commands

    parser = OneLineParser(
        prog="foresight",
        description="foresightkv: learned KV-cache eviction for long LLM reasoning.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="show library logs and tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{commands.__name__}.{mod.name}").register(sub)
    return parser


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
    from foresight.config import check_output_dir
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
        if extra:  # `train sl lr=0.1 --config x.yaml steps=5`: overrides on both sides of the options
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
