"""Trace sampling (``foresight trace``'s decode) with finished rows kept in the batch and dropped from it.

``foresight.generate`` drops the rows that reached EOS from the batch at its every-16-step read
(:meth:`foresight.cache.BudgetedCache.select_rows`) when the policy's per-row state can follow and a row's tokens
do not depend on the other rows' (one seed per row, as trace sampling uses). This script samples the same traces as
``foresight trace`` would (its prompts, per-trace seeds and sampling settings, the full cache) three ways, in one run:

- batches of ``--batch-size`` with every row decoded to the end (the cost before, ``selects_rows`` switched off);
- the same batches, finished rows dropped;
- batches of twice that size, finished rows dropped;

and checks that every way samples the same tokens:

    python benchmarks/bench_trace.py                      # 32 MATH-500 problems, batches of 16, 512 new tokens
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import torch

import foresight
from foresight.config import positive_int
from foresight.data import load_problems
from foresight.errors import OneLineParser, run_script
from foresight.policies.full import FullPolicy
from foresight.prompts import build_prompt, load_template
from golden.traces import trace_seed


@contextmanager
def rows_dropped(flag: bool):
    saved = FullPolicy.selects_rows
    FullPolicy.selects_rows = flag
    try:
        yield
    finally:
        FullPolicy.selects_rows = saved


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--problems", type=positive_int, default=32, help="the first N MATH-500 problems")
    ap.add_argument("--batch-size", type=positive_int, default=16)
    ap.add_argument("--max-new-tokens", type=positive_int, default=512)
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    problems = load_problems("math500", limit=args.problems)
    model, tok = foresight.load_model(args.model)
    template = load_template(None)
    prompts = [tok(build_prompt(tok, p.problem, template))["input_ids"] for p in problems]
    seeds = [trace_seed(0, p.id, 0) for p in problems]

    def sample(batch: int) -> list[list[int]]:
        out = []
        for i in range(0, len(prompts), batch):
            res = foresight.generate(model, tok, prompts[i : i + batch], max_new_tokens=args.max_new_tokens,
                                     do_sample=True, temperature=0.6, top_p=0.95, top_k=20, seed=seeds[i : i + batch])
            out += res.token_ids
        return out

    foresight.generate(model, tok, prompts[:2], max_new_tokens=8, do_sample=True, seed=[0, 1])  # warm-up, untimed
    ways = [(f"batch {args.batch_size}, every row to the end", args.batch_size, False),
            (f"batch {args.batch_size}, finished rows dropped", args.batch_size, True),
            (f"batch {2 * args.batch_size}, finished rows dropped", 2 * args.batch_size, True)]
    rows, ref = [], None
    for name, batch, drop in ways:
        with rows_dropped(drop):
            t0 = time.perf_counter()
            tokens = sample(batch)
            seconds = time.perf_counter() - t0
        ref = ref if ref is not None else (seconds, tokens)
        rows.append((name, seconds, ref[0] / seconds, tokens == ref[1]))
    lengths = sorted(len(t) for t in ref[1])
    print(f"{args.model}, {len(prompts)} MATH-500 problems, up to {args.max_new_tokens} new tokens (T=0.6, top-p 0.95, "
          f"top-k 20, a seed per trace), {torch.get_num_threads()} torch thread(s); generated lengths: median "
          f"{lengths[len(lengths) // 2]}, {sum(n == args.max_new_tokens for n in lengths)} at the limit")
    print("| decode | seconds | speed-up | same tokens |")
    print("|---|---:|---:|---|")
    for name, seconds, speedup, same in rows:
        print(f"| {name} | {seconds:.1f} | {speedup:.2f}x | {same} |")
    return 0


if __name__ == "__main__":
    run_script(main, "bench_trace")
