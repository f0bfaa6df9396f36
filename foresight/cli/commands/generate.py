"""``foresight generate``: generate text under a KV budget and print cache statistics."""

from __future__ import annotations

import time

from foresight.cli.args import (add_cache_args, add_model_args, add_policy_args, policy_kwargs, print_json,
                                           refuse_unused_cache_args)
from foresight.config import (nonempty_text, nonnegative_float, nonnegative_int, positive_int, seed_int,
                              unit_float)
from foresight.errors import ForesightError


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a budgeted KV cache")
    add_model_args(p)
    p.add_argument("--prompt", action="append", required=True, type=nonempty_text, help="prompt text (repeat for a batch)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_policy_args(p)
    add_cache_args(p)
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--temperature", type=nonnegative_float, default=None,
                   help="sample with this temperature (default, or 0: greedy)")
    p.add_argument("--top-p", type=unit_float, default=1.0, help="nucleus sampling (with --temperature)")
    p.add_argument("--top-k", type=nonnegative_int, default=0, help="top-k sampling (with --temperature; 0: off)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    p.set_defaults(func=run)


def run(args) -> int:
    import foresight
    from foresight.policies import make_policy
    from foresight.policies.base import require_cache
    from foresight.schedule import cache_config_arg

    if not args.temperature and (args.top_p != 1.0 or args.top_k):  # greedy decoding would ignore them
        flag = f"--top-p {args.top_p}" if args.top_p != 1.0 else f"--top-k {args.top_k}"
        raise ForesightError(f"{flag} only applies when sampling: pass --temperature T > 0 (the default, or 0, "
                             "decodes greedily)")
    policy = make_policy(args.policy, **policy_kwargs(args)[args.policy])  # validate before loading the model
    if policy.evicts and args.budget is None:
        raise ValueError(f"policy {args.policy!r} evicts: pass --budget (and --interval)")
    refuse_unused_cache_args(args, policy)  # the full cache would be kept, yet the stats would print the budget
    cfg = cache_config_arg(args.budget, args.interval, args.sinks, flags="--budget/--interval/--sinks")
    if policy.evicts:  # paged's block against W, a scorer trained at another B, W: found after the model load before
        require_cache(policy, cfg.budget, cfg.interval)
    model, tok = foresight.load_model(args.model, device=args.device, dtype=args.dtype,
                                      adapter=args.adapter)
    prompts = args.prompt
    if args.chat:
        prompts = [
            tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
    t0 = time.perf_counter()
    res = foresight.generate(
        model,
        tok,
        prompts,
        policy=policy,
        budget=args.budget,
        interval=args.interval,
        sinks=args.sinks,
        max_new_tokens=args.max_new_tokens,
        do_sample=bool(args.temperature),
        temperature=args.temperature or 1.0,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    elapsed = time.perf_counter() - t0
    new_tokens = sum(len(t) for t in res.token_ids)
    stats = {**res.stats, "new_tokens": new_tokens, "seconds": round(elapsed, 3),
             "tokens_per_s": round(new_tokens / elapsed, 2) if elapsed else None}
    if args.json:
        print_json({"texts": res.texts, "token_ids": res.token_ids, "stats": stats})
        return 0
    for i, text in enumerate(res.texts):
        if len(res.texts) > 1:
            print(f"--- [{i}]")
        print(text)
    peak = stats["peak_entries"]
    print(
        f"\n[{stats['policy']}] budget={stats['budget']} interval={stats['interval']} "
        f"new_tokens={new_tokens} peak_entries/layer={max(peak)} final_entries={stats['final_entries']} "
        f"evictions={stats['evictions']} {stats['tokens_per_s']} tok/s"
    )
    return 0
