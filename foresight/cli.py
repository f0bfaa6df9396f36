"""The ``foresight`` command line. Each subcommand lives in its own module under :mod:`foresight.commands`.

A command module defines ``register(subparsers)`` which adds its parser and sets ``func`` (a callable taking the
parsed args and returning an exit code). Modules are discovered automatically; errors a user can fix
(bad input, missing files) are printed as one line and exit with status 2, never as a stack trace.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


from foresight.errors import ForesightError

UserError = ForesightError  # raised by commands for input the user can fix; printed without a traceback


def build_parser() -> argparse.ArgumentParser:
    import foresight.commands as commands

    parser = argparse.ArgumentParser(
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        logging.getLogger("deepspeed").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except (ForesightError, ValueError, FileNotFoundError, OSError) as exc:
        if args.verbose:
            raise
        print(f"foresight {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
