"""Packed vs dense event files, side by side in one run: bytes on disk and the time to read training batches.

Takes packed feature-cache files (``foresight train sl``'s ``feature_cache/<key>/``), writes a dense copy of each
(the dense layout) into a temporary directory, checks that both read back identically, then draws the
same random batches of events from both through :class:`training.mapped_events.EventRows` for a feature set
and prints the time per batch of each and their ratio. The files are read once before timing, so both sit in the
page cache: this measures the CPU cost of rebuilding packed features, not the disk (where packed files win by
their size alone, once the dense ones outgrow the page cache).

    .venv/bin/python benchmarks/bench_packed_events.py runs/quality/features/<key> --files 40
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.features import FEATURE_GROUPS, check_feature_set, feature_columns
from training.event_files import load_events
from training.mapped_events import EventRows, map_safetensors
from training.packed_events import PackedPart
from training.sl_features import FEATURE_CACHE_FORMAT


def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("cache", help="a feature-cache directory of packed .safetensors files")
    p.add_argument("--files", type=positive_int, default=40)
    p.add_argument("--features", default="prekey,value,attn,age")
    p.add_argument("--batches", type=positive_int, default=200)
    p.add_argument("--micro-batch", type=positive_int, default=8)
    args = p.parse_args()
    try:
        features = check_feature_set(args.features)
    except ValueError as exc:
        raise ForesightError(f"--features: {exc}") from None
    files = sorted(Path(args.cache).glob("*.safetensors"))[: args.files]
    evs = [load_events(f, FEATURE_CACHE_FORMAT) for f in files]
    packed = [ev.features for ev in evs]
    if not files or not all(isinstance(x, PackedPart) for x in packed):
        raise ForesightError(f"{args.cache}: no packed feature-cache files (a feature_cache/<key> directory)")
    layers = packed[0].shape[1]
    cols = torch.tensor(feature_columns(features, tuple(FEATURE_GROUPS), packed[0].head_dim,
                                        packed[0].num_groups))
    with tempfile.TemporaryDirectory() as tmp:
        dense = []
        for i, ev in enumerate(evs):  # the dense layout: every column of every candidate at every event
            path = Path(tmp) / f"{i}.safetensors"
            save_file({"features": EventRows([ev.features])[:].contiguous(), "alpha": ev.alpha,
                       "evicted": ev.evicted.to(torch.uint8), "positions": ev.positions}, str(path))
            dense.append(path)
        dense = [map_safetensors(path)[1]["features"] for path in dense]
        a, b = EventRows(packed, cols), EventRows(dense, cols)
        assert torch.equal(a[:], b[:]), "packed and dense files differ"  # also reads both into the page cache
        size_p = sum(f.stat().st_size for f in files)
        size_d = sum(Path(tmp, f"{i}.safetensors").stat().st_size for i in range(len(files)))
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(len(a), (args.micro_batch,), generator=gen) for _ in range(args.batches)]
        times = {}
        for name, ev in (("dense", b), ("packed", a), ("dense again", b), ("packed again", a)):
            t0 = time.perf_counter()
            for idx in batches:
                ev[idx]
            times[name] = (time.perf_counter() - t0) / len(batches)
    dense_t = min(times["dense"], times["dense again"])
    packed_t = min(times["packed"], times["packed again"])
    print(f"{len(files)} traces, {len(a)} events, {layers} layers, features {args.features} ({len(cols)} columns)")
    print(f"bytes on disk: dense {size_d / 1e9:.3f} GB, packed {size_p / 1e9:.3f} GB "
          f"(features, alpha, evict flags, positions), ratio {size_d / size_p:.2f}x")
    print(f"read a batch of {args.micro_batch} events from the page cache: dense {dense_t * 1e3:.1f} ms, "
          f"packed {packed_t * 1e3:.1f} ms, packed/dense {packed_t / dense_t:.2f}")
    return 0


if __name__ == "__main__":
    run_script(main, "bench_packed_events")
