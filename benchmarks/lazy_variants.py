"""LazyEviction's two bookkeeping variants side by side on the same traces (docs/policies.md).

Replays every trace of a ``foresight trace`` directory with the full cache and under each variant at one budget
``B`` and interval ``W`` and reports the loss ratio the way ``foresight eval fidelity`` does: mean CE with
eviction / mean CE with the full cache, pooled over the positions ``>= B + W`` of every trace.

Variants: ``lazy`` with ``entry=published`` given each trace's prompt length (``prompt_lengths`` meta: prompt
rows not observed, prompt tokens enter with ``last = P - 1``), the same without the prompt length (every token
counts as generated), ``entry=fresh`` (enters with ``last = t``, every row observed), and ``h2o`` and
``streaming_llm`` for scale::

    foresight trace --model smollm2-135m --data synthetic --limit 6 --max-new-tokens 200 --out runs/lazy_traces
    python benchmarks/lazy_variants.py --traces runs/lazy_traces --budget 64 --interval 16

JSON goes to ``runs/lazy_variants.json`` (``--out``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

import foresight
from foresight.config import positive_int
from foresight.errors import OneLineParser, run_script
from golden.traces import load_traces

#: label -> (policy name, policy kwargs, pass the trace's prompt length)
VARIANTS = {
    "lazy (published, prompt given)": ("lazy", {"entry": "published"}, True),
    "lazy (published, no prompt length)": ("lazy", {"entry": "published"}, False),
    "lazy (fresh)": ("lazy", {"entry": "fresh"}, False),
    "h2o": ("h2o", {}, False),
    "streaming_llm": ("streaming_llm", {}, False),
}


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n")[0])
    p.add_argument("--traces", required=True, help="a `foresight trace` output directory")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--interval", type=int, default=16)
    p.add_argument("--limit", type=positive_int, default=None, help="first N traces only")
    p.add_argument("--out", default="runs/lazy_variants.json")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    ds = load_traces(args.traces)
    rows = list(ds)[: args.limit]
    model, _ = foresight.load_model(args.model)
    first = args.budget + args.interval
    sums = {label: [0.0, 0.0, 0] for label in VARIANTS}  # ce, ce_full, tokens
    per_trace = []
    t0 = time.perf_counter()
    for row in rows:
        ids, plen = list(row["input_ids"]), int(row["prompt_len"])
        if len(ids) - 1 <= first:
            continue
        full = foresight.replay(model, [ids], "full", interval=args.interval).ce[0, first:]
        rec = {"trace_id": row["trace_id"], "length": len(ids), "prompt_len": plen}
        for label, (name, kwargs, give_prompt) in VARIANTS.items():
            meta = {"prompt_lengths": [plen]} if give_prompt else {}
            ce = foresight.replay(model, [ids], name, budget=args.budget, interval=args.interval,
                                  policy_kwargs=kwargs, **meta).ce[0, first:]
            s = sums[label]
            s[0] += float(ce.double().sum())
            s[1] += float(full.double().sum())
            s[2] += ce.numel()
            rec[label] = float(ce.double().sum() / full.double().sum())
        per_trace.append(rec)
    seconds = time.perf_counter() - t0

    ratios = {label: s[0] / s[1] for label, s in sums.items() if s[2]}
    tokens = next(iter(sums.values()))[2]
    print(f"{len(per_trace)} traces, {tokens} scored positions (>= B+W = {first}), B={args.budget} W={args.interval}, "
          f"{seconds:.0f} s")
    print("| variant | loss ratio | " + " | ".join(r["trace_id"] for r in per_trace) + " |")
    print("|---|---:|" + "---:|" * len(per_trace))
    for label, ratio in ratios.items():
        print(f"| {label} | {ratio:.4f} | " + " | ".join(f"{r[label]:.3f}" for r in per_trace) + " |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "budget": args.budget, "interval": args.interval,
                               "traces": args.traces, "scored_tokens": tokens, "loss_ratio": ratios,
                               "per_trace": per_trace, "seconds": seconds}, indent=2))
    return 0


if __name__ == "__main__":
    run_script(main, "lazy_variants")
