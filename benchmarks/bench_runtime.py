"""Decode throughput of ``foresight.generate`` against ``model.generate`` driving the very same cache, and against
plain ``model.generate`` (HF's dynamic cache).

All sides run greedy decoding of the same prompt for the same number of new tokens (EOS ignored), interleaved
repetition by repetition so that machine noise hits them alike; prints tokens/s and the ratio of
``foresight.generate`` to ``model.generate`` with a :class:`~foresight.cache.BudgetedCache` of the same policy, B and
W (the runtime's own loop against HF's around the same cache and forward).

    python benchmarks/bench_runtime.py --new-tokens 256 --repeats 3
    python benchmarks/bench_runtime.py --policy h2o --budget 64 --interval 16 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import foresight
from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_file
from foresight.policies import checked_policy
from foresight.schedule import cache_config_arg


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--new-tokens", type=positive_int, default=256)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--policy", default="full", help="policy for the foresight side (default full)")
    ap.add_argument("--budget", type=positive_int, default=None)
    ap.add_argument("--interval", type=positive_int, default=None)
    ap.add_argument("--batch-size", type=positive_int, default=1)
    ap.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args()
    # what would fail (or, without a budget, silently never evict) after the model load fails now
    check_output_file(args.json, "--json")
    if args.policy != "full" and args.budget is None:
        raise ForesightError(f"--policy {args.policy}: needs --budget (without one the cache is unbounded and "
                             "nothing is evicted)")
    if args.interval is not None and args.budget is None:
        raise ForesightError("--interval: needs --budget")
    cfg = cache_config_arg(args.budget, args.interval)
    if not checked_policy(args.policy, [(cfg.budget, cfg.interval)], f"--policy {args.policy}").evicts and args.budget:
        raise ForesightError(f"--budget {args.budget}: policy {args.policy!r} never evicts, so the budget would be "
                             "ignored; pick an evicting policy with --policy")

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = foresight.load_model(args.model)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Solve step by step: what is the sum of the first 50 odd numbers?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompts = [prompt] * args.batch_size
    enc = tok(prompts, return_tensors="pt").to(model.device)
    n = args.new_tokens

    def hf():
        model.generate(**enc, do_sample=False, max_new_tokens=n, min_new_tokens=n)

    def hf_cache():
        cache = foresight.BudgetedCache(model, args.policy, args.budget, args.interval)
        model.generate(**enc, past_key_values=cache, do_sample=False, max_new_tokens=n, min_new_tokens=n)

    def ours():
        foresight.generate(model, tok, prompts, policy=args.policy, budget=args.budget, interval=args.interval,
                           max_new_tokens=n, stop_on_eos=False)

    sides = {"hf_generate": hf, "hf_generate+cache": hf_cache, "foresight": ours}
    with torch.inference_mode():
        for run in sides.values():  # warm-up
            run()
        times = {k: [] for k in sides}
        for _ in range(args.repeats):
            for k, run in sides.items():
                times[k].append(_time(run))
    tps = {k: n * args.batch_size / statistics.median(v) for k, v in times.items()}
    ratio = tps["foresight"] / tps["hf_generate+cache"]
    result = {"model": args.model, "new_tokens": n, "repeats": args.repeats, "policy": args.policy,
              "budget": cfg.budget, "interval": cfg.interval,  # the cache of both budgeted sides (None: full)
              "batch_size": args.batch_size,
              "device": str(model.device), "threads": torch.get_num_threads(),
              "tokens_per_s": {k: round(v, 2) for k, v in tps.items()}, "ratio": round(ratio, 3)}
    print(f"foresight side: policy {args.policy}" + (f", B={cfg.budget} W={cfg.interval}" if cfg.budget else ""))
    print(f"{'runner':<20}{'tokens/s':>10}")
    for k, v in tps.items():
        print(f"{k:<20}{v:>10.2f}")
    print(f"ratio foresight/hf_generate+cache = {ratio:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    run_script(main, "bench_runtime")
