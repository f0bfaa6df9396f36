"""Decode throughput of every eviction policy relative to ``streaming_llm`` (the cheapest), in one run.

Each policy generates ``--new-tokens`` tokens (no early stop) from the same prompt at budget B / interval W.
Repetitions are interleaved (every repetition runs every policy, in a rotated order) so that background load
hits all policies alike; the ratio of each policy is taken against ``streaming_llm`` within the same
repetition, and the median over repetitions is reported.

    python benchmarks/bench_policies.py                      # smollm2-135m, B=256, W=64, 1024 new tokens
    python benchmarks/bench_policies.py --new-tokens 512 --policies streaming_llm,h2o,lazy --reps 3
    python benchmarks/bench_policies.py --budget 64 --interval 16 --policies streaming_llm,h2o \
        --scorer ens=smollm2-135m-b64-w16 --scorer one=runs/quality_B64_prekey_dagger/scorer

``--scorer NAME=DIR`` (repeatable) adds the ``learned`` policy with that scorer as ``learned:NAME``; each scorer is
loaded once, before any timing.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import foresight
from foresight.config import device_arg, positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.policies import POLICIES, checked_policy, make_policy, policy_names
from foresight.schedule import cache_config_arg
from foresight.scorer import Scorer

REFERENCE = "streaming_llm"
PROMPT = (
    "Solve step by step and put the final answer in \\boxed{}: a train travels 120 km in 1.5 hours, then 200 km "
    "in 2.5 hours. What is its average speed over the whole trip?"
)


def default_policies(budget: int | None = None, interval: int | None = None) -> list[str]:
    """Every policy that runs without arguments (and, given B and W, takes that cache: paged needs W a multiple of
    its block)."""
    names = []
    for name in policy_names():
        if POLICIES[name].replay_only:
            continue
        try:
            make_policy(name).check_cache(budget, interval)
        except Exception:  # needs arguments (e.g. learned needs a scorer), or not this (B, W)
            continue
        names.append(name)
    return names


def parse_scorers(specs: list[str]) -> dict[str, str]:
    """``NAME=DIR`` options to {``learned:NAME``: DIR}; one line naming the bad value otherwise."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ForesightError(f"--scorer {spec!r}: expected NAME=DIR (a scorer directory or shipped name)")
        if f"learned:{name}" in out:
            raise ForesightError(f"--scorer {spec!r}: the name {name!r} is given twice")
        out[f"learned:{name}"] = path
    return out


def run_once(model, tok, prompt_ids, name, args, scorers=None) -> float:
    scorer = (scorers or {}).get(name)
    policy = make_policy("learned", scorer=scorer) if scorer is not None else make_policy(name)
    t0 = time.perf_counter()
    res = foresight.generate(
        model, tok, [prompt_ids] * args.batch, policy=policy, budget=args.budget, interval=args.interval,
        max_new_tokens=args.new_tokens, stop_on_eos=False,
    )
    dt = time.perf_counter() - t0
    assert all(len(t) == args.new_tokens for t in res.token_ids)
    return args.batch * args.new_tokens / dt


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--policies", default=None, help="comma-separated names (default: every runnable policy)")
    p.add_argument("--new-tokens", type=positive_int, default=1024)
    p.add_argument("--budget", type=positive_int, default=256)
    p.add_argument("--interval", type=positive_int, default=64)
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--reps", type=positive_int, default=2)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", type=device_arg, default=None)
    p.add_argument("--scorer", action="append", default=[], metavar="NAME=DIR",
                   help="also time `learned` with this scorer, as learned:NAME (repeatable)")
    p.add_argument("--out", default="runs/bench_policies.json")
    args = p.parse_args(argv)
    # what would fail after the model load and the warm-up (or, for --out, after the whole benchmark) fails now
    cache_config_arg(args.budget, args.interval)
    if Path(args.out).is_dir():
        raise ForesightError(f"--out {args.out}: is a directory; name the JSON file to write")
    blocking = next((d for d in Path(args.out).parents if d.exists()), None)  # its folders are made at the end
    if blocking is not None and not blocking.is_dir():
        raise ForesightError(f"--out {args.out}: {blocking} is not a directory")
    if args.threads:
        torch.set_num_threads(args.threads)

    names = args.policies.split(",") if args.policies else default_policies(args.budget, args.interval)
    for name in names:  # e.g. paged needs W a multiple of its block
        checked_policy(name, [(args.budget, args.interval)], f"--policies {name!r}")
    if REFERENCE not in names:
        names.insert(0, REFERENCE)
    paths = parse_scorers(args.scorer)
    names += list(paths)
    scorers = {n: Scorer.from_pretrained(path) for n, path in paths.items()}  # checked, loaded once, before the model
    for n, scorer in scorers.items():
        checked_policy("learned", [(args.budget, args.interval)], f"--scorer {n.split(':', 1)[1]}={paths[n]}",
                       scorer=scorer)
    model, tok = foresight.load_model(args.model, device=args.device)
    for scorer in scorers.values():
        scorer.check_compatible(model)
    prompt_ids = tok(PROMPT)["input_ids"]
    run_once(model, tok, prompt_ids, REFERENCE, argparse.Namespace(**{**vars(args), "new_tokens": 8}))  # warm-up

    tps: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        this = {}
        for name in order:
            this[name] = run_once(model, tok, prompt_ids, name, args, scorers)
            print(f"rep {rep} {name:14s} {this[name]:8.2f} tok/s", flush=True)
        for name in names:
            tps[name].append(this[name])
            ratios[name].append(this[name] / this[REFERENCE])

    rows = [
        {
            "policy": n,
            "tokens_per_s": round(statistics.median(tps[n]), 2),
            "ratio_vs_streaming_llm": round(statistics.median(ratios[n]), 3),
            "ratios": [round(r, 3) for r in ratios[n]],
            "observes_attention": bool(getattr(POLICIES[n.split(":")[0]], "observes", False)),
        }
        for n in names
    ]
    print(f"\n{args.model} B={args.budget} W={args.interval} batch={args.batch} new_tokens={args.new_tokens} "
          f"reps={args.reps} threads={torch.get_num_threads()}")
    print(f"{'policy':14s} {'tok/s':>8s} {'x stream':>9s}  attention")
    for r in rows:
        print(f"{r['policy']:14s} {r['tokens_per_s']:8.2f} {r['ratio_vs_streaming_llm']:9.3f}  "
              f"{'yes' if r['observes_attention'] else 'no'}")
    out = Path(args.out)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    meta.update(threads=torch.get_num_threads(), torch=torch.__version__, machine=platform.machine(),
                device=str(model.device))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"settings": meta, "results": rows}, indent=2))
    except OSError as exc:
        raise ForesightError(f"--out {out}: cannot write ({exc.strerror}: {exc.filename})") from None
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "bench_policies")
