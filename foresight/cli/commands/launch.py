"""``foresight launch``: run a ``foresight`` command on N ranks of this machine (torchrun's elastic launcher, in
process), keeping the command line's contract that torchrun itself breaks.

Under a bare ``torchrun -m foresight ...`` a refused input prints one line per rank and then torchrun's own report
(a ``ChildFailedError`` traceback, exit status 1). Here the launched command's usage is checked before any process
starts; each rank prints its error line and records it in a private directory (``FORESIGHT_ERROR_DIR``; see
:func:`foresight.cli.report`: a line several ranks meet is printed by the first only), and the launcher exits with
the status of the first rank to fail: 2 when it refused its input, else 1. A launcher stopped by a signal (SIGTERM from
``timeout`` or a scheduler, SIGINT) says so in one line and exits 128 + the signal's number, as a shell does; a
resumable command continues with ``--resume``. torchrun's launch options:
https://pytorch.org/docs/stable/elastic/run.html; for several nodes use torchrun or DeepSpeed's launcher directly.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from foresight.cli import ERROR_DIR
from foresight.config import positive_int
from foresight.errors import ForesightError


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port (1-65535), got {text!r}")
    return value


def register(sub) -> None:
    p = sub.add_parser("launch", help="run a foresight command on N local ranks (torchrun), errors as one line",
                       description="Run COMMAND (e.g. `train sl --config configs/sl.yaml`) on N ranks of this machine.")
    p.add_argument("--nproc-per-node", type=positive_int, default=2, help="ranks to start (default 2)")
    p.add_argument("--master-port", type=port, default=29500, help="rendezvous port (default 29500)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                   help="the foresight command and its arguments")
    p.set_defaults(func=run)


def run(args) -> int:
    from foresight.cli import parse_command

    argv = args.argv[1:] if args.argv[:1] == ["--"] else list(args.argv)
    if not argv or argv[0].startswith("-"):
        raise ForesightError("give the command to launch after the options, e.g. `foresight launch "
                             "--nproc-per-node 2 train sl --config configs/sl.yaml`")
    if argv[0] == "launch":
        raise ForesightError("`foresight launch launch` would start ranks that start ranks; launch the command itself")
    code = parse_command(argv)  # a usage error of the launched command: one line, before any process starts
    if code is not None:
        return code
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as elastic_run

    if not args.verbose:  # its per-failure log lines repeat what the ranks said
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    launch_args = get_args_parser().parse_args(
        ["--nproc_per_node", str(args.nproc_per_node), "--master_port", str(args.master_port), "-m", "foresight",
         *(["--verbose"] if args.verbose else []), *argv])
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets per rank anyway, without its banner
    with tempfile.TemporaryDirectory(prefix="foresight-launch-") as tmp:
        before = os.environ.get(ERROR_DIR)
        os.environ[ERROR_DIR] = tmp
        try:
            elastic_run(launch_args)
            return 0
        except ChildFailedError as exc:
            return _report_failure(exc, Path(tmp))
        except SignalException as exc:  # torchrun stopped its ranks before re-raising the signal as this
            sig = signal.Signals(exc.sigval)
            print(f"foresight launch: interrupted by {sig.name}; the ranks were stopped (a resumable command "
                  "continues with --resume)", file=sys.stderr)
            return 128 + int(sig)
        finally:
            if before is None:
                os.environ.pop(ERROR_DIR, None)
            else:
                os.environ[ERROR_DIR] = before


def _report_failure(exc, errors: Path) -> int:
    """The exit status of a failed launch (the ranks printed their error lines): 2 if the first rank to fail refused
    its input (exit 2: the ranks the launcher stopped after it are its consequence), else 1; when no rank said
    anything, one line naming the rank that failed first."""
    lines = [line for f in errors.glob("rank-*.txt") for line in f.read_text().splitlines() if line]
    first, failure = exc.get_first_failure()
    if lines and failure.exitcode == 2:
        return 2
    if not lines:
        how = f"killed by signal {-failure.exitcode}" if failure.exitcode < 0 else f"exit status {failure.exitcode}"
        print(f"foresight launch: error: rank {first} failed first ({how}; see its output above)", file=sys.stderr)
    return 1
