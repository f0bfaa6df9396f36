"""Targets read in place vs cloned and concatenated, side by side in one run: the anonymous memory a process holds
for the α, evict flags and positions of many recorded events, and the time to gather a training batch of them.

Cloning each trace's targets out of its mapped file and concatenating them (:func:`training.event_files.
concat_events`) costs a rank memory in proportion to the events: a third DAgger round of 656 traces (60k events)
was killed for memory that way. Training reads them as views of the mapped files (:class:`training.mapped_events.
EventRows`) instead. This reads the same event files both ways in one process and prints the growth of ``RssAnon``
(``/proc/self/status``, Linux) after each, and the time per batch of random events for each, with their ratios.
Both timings read from the page cache (every page is read once before).

    .venv/bin/python benchmarks/bench_event_targets.py runs/quality/features/<key> --files 300
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import torch

from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from training.event_files import TARGETS, concat_events, join_events, read_events, saved_metadata
from training.onpolicy import ROWS_FORMAT
from training.sl_features import FEATURE_CACHE_FORMAT


def anon_bytes() -> int:
    """This process's anonymous resident memory (``RssAnon``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise ForesightError("no RssAnon in /proc/self/status: this benchmark needs Linux")


def gather_time(targets: dict, batches: int, micro_batch: int) -> float:
    """Seconds per batch of ``micro_batch`` random events gathered from every target (the loss's reads)."""
    gen = torch.Generator().manual_seed(0)
    n = targets["alpha"].shape[0]
    idx = [torch.randint(n, (micro_batch,), generator=gen) for _ in range(batches)]
    t0 = time.perf_counter()
    for i in idx:
        for name in TARGETS:
            targets[name][i]
    return (time.perf_counter() - t0) / batches


def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("events", help="a directory of event files: a feature_cache/<key> or a DAgger round's rows/")
    p.add_argument("--files", type=positive_int, default=300)
    p.add_argument("--batches", type=positive_int, default=500)
    p.add_argument("--micro-batch", type=positive_int, default=8)
    args = p.parse_args()
    files = sorted(Path(args.events).glob("*.safetensors"))[: args.files]
    if not files:
        raise ForesightError(f"{args.events}: no .safetensors event files (a feature_cache/<key> or rows/ directory)")
    fmt = saved_metadata(files[0]).get("format")
    if fmt not in (FEATURE_CACHE_FORMAT, ROWS_FORMAT):
        raise ForesightError(f"{files[0]}: not a feature-cache or DAgger rows file (format {fmt!r})")
    anon_bytes()  # fail now on a system without it
    gc.collect()
    base = anon_bytes()
    half = len(files) // 2 or 1  # two halves joined, as DAgger joins the golden rows and a round's
    mapped = join_events([concat_events([read_events(f, fmt)[1] for f in part], None)
                          for part in (files[:half], files[half:]) if part])
    in_place = anon_bytes() - base
    for name in TARGETS:  # read every page once, so that both timings read from the page cache
        mapped[name][:]
    t_in_place = gather_time(mapped, args.batches, args.micro_batch)
    gc.collect()
    base = anon_bytes()
    evs = [read_events(f, fmt)[1] for f in files]
    cloned = {name: torch.cat([getattr(e, name).clone() for e in evs]) for name in TARGETS}  # the cloned layout
    cloned_bytes = anon_bytes() - base
    t_cloned = gather_time(cloned, args.batches, args.micro_batch)
    for name in TARGETS:  # the same events either way
        assert torch.equal(mapped[name][:], cloned[name]), name
    events = int(cloned["alpha"].shape[0])
    target_bytes = sum(t.numel() * t.element_size() for t in cloned.values())
    print(f"{len(files)} files ({fmt}), {events} events, targets {target_bytes / 1e6:.1f} MB")
    print(f"anonymous memory held: in place {in_place / 1e6:.1f} MB, cloned {cloned_bytes / 1e6:.1f} MB "
          f"(cloned / in place {cloned_bytes / max(in_place, 1):.1f}x)")
    print(f"time per batch of {args.micro_batch} events: in place {t_in_place * 1e3:.3f} ms, cloned "
          f"{t_cloned * 1e3:.3f} ms (in place / cloned {t_in_place / t_cloned:.2f}x)")
    return 0


if __name__ == "__main__":
    run_script(main, "bench_event_targets")
