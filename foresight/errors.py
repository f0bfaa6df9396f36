"""Errors a user can fix (bad names, missing files, bad hyperparameters): the CLI prints them in one line."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn


class ForesightError(Exception):
    """Base class of user-facing errors."""


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (``foresight generate: error: argument --top-p: ...``), exit status 2: the parser
    of ``foresight`` and of every stand-alone script."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def run_script(main: Callable[[], int], prog: str) -> NoReturn:
    """Run a stand-alone script's ``main`` under the command line's contract: a :class:`ForesightError` is one
    line on stderr and exit status 2 (benchmark scripts use it; ``foresight`` itself has its own entry point)."""
    try:
        sys.exit(main())
    except ForesightError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
