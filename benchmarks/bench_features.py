"""Cost of the feature extractor's per-step observation (the learned policy's and SL replay's hot path).

Drives :class:`foresight.features.FeatureExtractor` with synthetic attention at SmolLM2-135M shapes (30 layers,
3 KV heads, groups of 3, d=64) for ``--steps`` decode steps at budget B / interval W, evicting at the schedule's
events, and prints microseconds per (layer, step) of ``observe`` and the whole run. ``--compare FILE`` loads
another version of ``features.py`` (e.g. ``git show HEAD~1:foresight/features.py > old.py``) and times both,
interleaved, in one run (a ratio measured side by side; absolute numbers depend on the machine's load).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import torch

import foresight.features as current
from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.views import EvictView, StepView


def run(mod, steps: int, layers: int, hkv: int, groups: int, d: int, budget: int, interval: int) -> tuple[float, float]:
    ext = mod.FeatureExtractor(window=interval)
    ext.reset(layers, groups)
    n, t_obs, t0 = budget, 0.0, time.perf_counter()
    keys = torch.randn(1, hkv, 1, d)
    for s in range(steps):
        n += 1
        probs = torch.rand(1, hkv, groups, 1, n)
        for layer in range(layers):
            view = StepView(layer, torch.zeros(1, hkv * groups, 1, d), keys, keys, torch.zeros(1, hkv, n),
                            torch.ones(1, hkv, n, dtype=torch.bool), torch.zeros(1, 1), None, s, None, probs)
            a = time.perf_counter()
            ext.observe(view)
            t_obs += time.perf_counter() - a
        if n >= budget + interval:
            for layer in range(layers):
                ev = EvictView(torch.randn(1, hkv, n, d), torch.randn(1, hkv, n, d),
                               torch.arange(n).expand(1, hkv, n), torch.ones(1, hkv, n, dtype=torch.bool),
                               n - interval, budget - interval, 0, s, layer_idx=layer)
                ext.features(ev)
                kept = torch.randperm(n - interval)[: budget - interval].sort().values
                ext.on_evict(layer, torch.cat([kept, torch.arange(n - interval, n)]).expand(1, hkv, -1).contiguous())
            n = budget
    return time.perf_counter() - t0, t_obs


def main() -> None:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, default=400)
    p.add_argument("--budget", type=positive_int, default=256)
    p.add_argument("--interval", type=positive_int, default=64)
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--compare", default=None, help="another features.py to time side by side")
    args = p.parse_args()
    torch.set_num_threads(1)
    versions = [("current", current)]
    if args.compare:
        spec = importlib.util.spec_from_file_location("features_compare", args.compare)
        if not Path(args.compare).is_file() or spec is None:
            raise ForesightError(f"--compare {args.compare}: not a Python file (a features.py to time)")
        other = importlib.util.module_from_spec(spec)
        sys.modules["features_compare"] = other
        spec.loader.exec_module(other)
        versions.insert(0, (args.compare, other))
    for _ in range(args.repeats):
        for name, mod in versions:
            total, obs = run(mod, args.steps, 30, 3, 3, 64, args.budget, args.interval)
            print(f"{name}: observe {obs / args.steps / 30 * 1e6:.0f} us per (layer, step); run {total:.2f} s")


if __name__ == "__main__":
    run_script(main, "bench_features")
