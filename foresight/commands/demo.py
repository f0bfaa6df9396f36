"""``foresight demo``: the end-to-end demo that ``make demo`` runs.

Until the full pipeline demo lands (issue "demo"), it generates a short answer with the default model under a
KV budget and prints the cache statistics.
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="end-to-end demo on the default model (what `make demo` runs)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--interval", type=int, default=16)
    p.add_argument("--policy", default="streaming_llm")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    import foresight

    model, tok = foresight.load_model(args.model)
    question = "A farmer has 17 sheep and buys 25 more, then sells 9. How many sheep does he have? Answer in \\boxed{}."
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    for policy, budget in (("full", None), (args.policy, args.budget)):
        t0 = time.perf_counter()
        res = foresight.generate(model, tok, [prompt], policy=policy, budget=budget, interval=args.interval,
                                 max_new_tokens=args.max_new_tokens)
        dt = time.perf_counter() - t0
        s = res.stats
        print(f"=== policy={policy} budget={budget} interval={args.interval if budget else None}")
        print(res.texts[0].strip())
        print(f"--- prompt={res.prompt_lengths[0]} new={len(res.token_ids[0])} tokens, "
              f"peak KV entries/layer={max(s['peak_entries'])}, evictions={s['evictions']}, "
              f"{len(res.token_ids[0]) / dt:.1f} tok/s\n")
    return 0
