"""What verifying a shard on read costs: SHA-256 (what the manifests record) against a keyed BLAKE2b and a plain read.

Readers of ``foresight trace`` / ``foresight golden`` output check every shard against its manifest
(:func:`golden.sharding.check_shard`). The largest shards are golden label files: per trace ``L x Hkv x sum(ends)``
fp32 foresight values, about 95 MB for a 4,096-token SmolLM2-135M trace at B=128, W=32 (30 layers, 3 KV heads,
124 events), so about 380 MB for a shard of four. This script writes a file of that size (random bytes, which
hash at the same speed as labels) and times, interleaved repetition by repetition so machine noise hits every
method alike, reading it whole (the floor any digest pays), reading it with SHA-256 (:func:`foresight.fingerprint
.file_sha256`) and reading it with a keyed BLAKE2b (hashlib, 1 MiB blocks). A second read of a file comes from the
page cache, as it does when a job reads a shard it just verified.

    python benchmarks/bench_shard_digest.py --mb 380 --repeats 5 --json benchmarks/current/shard_digest/result.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from foresight.config import positive_int
from foresight.errors import OneLineParser, run_script
from foresight.fingerprint import file_sha256
from foresight.output_paths import check_output_file

BLOCK = 1 << 20


def _read(path: Path) -> None:
    with path.open("rb") as f:
        while f.read(BLOCK):
            pass


def _blake2b(path: Path) -> str:
    h = hashlib.blake2b(key=b"foresight-shard", digest_size=32)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


METHODS = {"read": _read, "sha256": file_sha256, "blake2b_keyed": _blake2b}


def main() -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=positive_int, default=380, help="file size in MB (default: a 4-trace label shard)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    check_output_file(args.json, "--json")
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shard.bin"
        with path.open("wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        _read(path)  # into the page cache
        for _ in range(args.repeats):
            for name, fn in METHODS.items():
                t0 = time.perf_counter()
                fn(path)
                times[name].append(time.perf_counter() - t0)
    med = {m: statistics.median(t) for m, t in times.items()}
    res = {"mb": args.mb, "repeats": args.repeats, "median_seconds": med,
           "gb_per_s": {m: args.mb / 1024 / s for m, s in med.items()},
           "sha256_over_read": med["sha256"] / med["read"], "blake2b_over_sha256": med["blake2b_keyed"] / med["sha256"]}
    for m in METHODS:
        print(f"{m:>14}: {med[m]:.3f} s  ({res['gb_per_s'][m]:.2f} GB/s)")
    print(f"sha256 / read = {res['sha256_over_read']:.2f}; blake2b (keyed) / sha256 = {res['blake2b_over_sha256']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_script(main, "bench_shard_digest.py")
