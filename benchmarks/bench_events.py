"""Wall time of one decode eviction event of ``learned``: every layer at once (``score_layers``) against layer by
layer, in one run.

Both sides generate ``--new-tokens`` tokens (EOS ignored) from the same prompt at B/W with the same scorer; the
per-layer side is the same policy with its all-layers path turned off. Each event's wall time (``BudgetedCache``'s
eviction: scoring, selection, gather, the policy's bookkeeping; the held decode steps' observation is not part
of it) is summed per run; repetitions are interleaved, and the median milliseconds per event are reported with
their ratio. Both sides must generate the same tokens (checked).

    python benchmarks/bench_events.py --repeats 3 --json benchmarks/current/events/result.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import foresight
from foresight.cache import BudgetedCache
from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_file
from foresight.policies.base import require_cache
from foresight.policies.learned import LearnedPolicy

PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
          "clips did Natalia sell altogether in April and May?")


class _LayerByLayer(LearnedPolicy):
    """``learned`` asked layer by layer (``score``/``select``/``on_evict`` once per layer)."""

    @property
    def scores_layers(self) -> bool:
        return False


class _EventTimer:
    """Sums the wall time of the cache's eviction events while installed."""

    def __init__(self):
        self.seconds, self.events = 0.0, 0
        self._orig = BudgetedCache._evict

    def __enter__(self):
        timer, orig = self, self._orig

        def timed(cache, *args, **kwargs):
            t0 = time.perf_counter()
            out = orig(cache, *args, **kwargs)
            timer.seconds += time.perf_counter() - t0
            timer.events += 1
            return out

        BudgetedCache._evict = timed
        return self

    def __exit__(self, *exc):
        BudgetedCache._evict = self._orig


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--scorer", default="smollm2-135m-b64-w16")
    ap.add_argument("--budget", type=positive_int, default=64)
    ap.add_argument("--interval", type=positive_int, default=16)
    ap.add_argument("--new-tokens", type=positive_int, default=400)
    ap.add_argument("--batch-size", type=positive_int, default=1)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    check_output_file(args.json, "--json")
    sides = {"layer by layer": _LayerByLayer, "all layers at once": LearnedPolicy}
    policies = {name: cls(scorer=args.scorer) for name, cls in sides.items()}  # the scorer is loaded before timing
    for policy in policies.values():  # a scorer of another B/W: one line, before the model loads
        require_cache(policy, args.budget, args.interval)
    model, tok = foresight.load_model(args.model)
    prompts = [PROMPT] * args.batch_size
    ms: dict[str, list[float]] = {name: [] for name in sides}
    tokens = {}
    for _ in range(args.repeats):
        for name, policy in policies.items():
            with _EventTimer() as timer:
                res = foresight.generate(model, tok, prompts, policy=policy, budget=args.budget,
                                         interval=args.interval, max_new_tokens=args.new_tokens, stop_on_eos=False)
            if not timer.events:
                raise ForesightError(f"--new-tokens {args.new_tokens}: no eviction event at B={args.budget}")
            ms[name].append(timer.seconds / timer.events * 1e3)
            tokens[name] = res.token_ids
    if tokens["layer by layer"] != tokens["all layers at once"]:
        raise ForesightError("the two sides generated different tokens")
    median = {name: statistics.median(v) for name, v in ms.items()}
    ratio = median["layer by layer"] / median["all layers at once"]
    print(f"learned ({args.scorer}), {args.model}, B={args.budget} W={args.interval}, batch {args.batch_size}, "
          f"{timer.events} events, median of {args.repeats} interleaved repeats, {torch.get_num_threads()} threads")
    for name, value in median.items():
        print(f"{name:<20}{value:8.1f} ms per event")
    print(f"all layers at once: {ratio:.2f}x faster per event; same tokens")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "scorer": args.scorer, "budget": args.budget, "interval": args.interval,
                       "new_tokens": args.new_tokens, "batch_size": args.batch_size, "events": timer.events,
                       "repeats": args.repeats, "ms_per_event": median, "speedup": ratio,
                       "torch_threads": torch.get_num_threads()}, fh, indent=1)
    return 0


if __name__ == "__main__":
    run_script(main, "bench_events")
