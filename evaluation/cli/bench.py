"""``foresight bench``: decode tokens/s and peak KV bytes of policies against the full cache, side by side."""

from __future__ import annotations

from foresight.cli.args import add_cache_args, add_model_args, add_policy_args, policy_kwargs
from foresight.config import nonempty_text, positive_int


def register(sub) -> None:
    p = sub.add_parser("bench", help="decode speed and peak KV memory per policy vs the full cache")
    add_model_args(p)
    p.add_argument("--policies", default="streaming_llm", help="comma-separated policies (full is always added)")
    # a budget is required: without one no policy evicts and the bench compares the full cache with itself
    add_cache_args(p, budget_required=True)
    p.add_argument("--new-tokens", type=positive_int, default=512, help="tokens generated per run (exactly, EOS ignored)")
    p.add_argument("--repeats", type=positive_int, default=3, help="interleaved repeats (median reported)")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--prompt", default=None, type=nonempty_text, help="prompt text (default: a short word problem)")
    p.add_argument("--scorer", default=None, help="scorer checkpoint for the `learned` policy")
    add_policy_args(p, several=True)
    p.add_argument("--compile", default="no", choices=("no", "yes", "both"),
                   help="decode on the static cache with a compiled step (docs/runtime.md): yes, or both side by side "
                        "(default: no, the eager cache)")
    p.add_argument("--out", default=None, help="directory for bench.json and bench.md")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    import foresight
    from evaluation.efficiency import (BENCH_OUTPUT, DEFAULT_PROMPT, bench_table, benchmark, refuse_uncompilable,
                                      write_bench)
    from evaluation.policies import check_requirements, make_factory, parse_policies
    from foresight.limits import check_memory, check_new_tokens, kv_bytes_per_token
    from foresight.outputs import check_output
    from foresight.policies import checked_policy
    from foresight.schedule import cache_config_arg
    from foresight.scorer import scorer_sha256

    names = [n for n in parse_policies(args.policies) if n != "full"]
    if "golden" in names:
        raise ValueError("the golden policy only replays fixed traces; it cannot be benchmarked for decoding")
    kwargs = policy_kwargs(args, ["full", *names])  # full is always measured, so it is in play too
    check_requirements(names, args.scorer, None, kwargs)
    cfg = cache_config_arg(args.budget, args.interval, args.sinks, flags="--budget/--interval/--sinks")
    args.interval = cfg.interval  # W = B // 4 unless given
    # hyperparameters and B, W (paged's block, a scorer's B, W), and what the static cache cannot take: before the
    # model loads
    refuse_uncompilable([checked_policy(name, [(cfg.budget, cfg.interval)], f"policy {name!r}",
                                        **({"scorer": args.scorer} if name == "learned" else {}), **kwargs[name])
                         for name in ["full", *names]], args.compile, cfg.budget)
    check_output(args.out, BENCH_OUTPUT)  # before the model loads, not after the work
    scorer_sha = scorer_sha256(args.scorer) if args.scorer else None  # the weights timed, read before the work
    model, tok = foresight.load_model(args.model, device=args.device, dtype=args.dtype,
                                      adapter=args.adapter)
    plen = len(tok(args.prompt or DEFAULT_PROMPT)["input_ids"])  # bounds before the work: the context, and the
    check_new_tokens(model, plen, args.new_tokens, "--new-tokens")  # full cache's memory (it keeps every token)
    check_memory(args.batch_size * (plen + args.new_tokens) * kv_bytes_per_token(model), model.device,
                 f"--batch-size {args.batch_size} x {plen + args.new_tokens} tokens", "lower --batch-size")
    factory = make_factory(model=model, scorer=args.scorer, interval=args.interval,
                           policy_kwargs=kwargs)
    records = benchmark(model, tok, names, args.budget, args.interval, args.new_tokens, repeats=args.repeats,
                        prompt=args.prompt, batch_size=args.batch_size, sinks=args.sinks, policy_factory=factory,
                        compile=args.compile, progress=not args.no_progress)
    table = bench_table(records)
    device = str(model.device)
    sinks = f", {args.sinks} attention sinks" if args.sinks else ""
    sinks += {"no": "", "yes": ", compiled static cache", "both": ", eager and compiled static cache"}[args.compile]
    header = (f"model `{args.model}` on {device}, B={args.budget}, W={args.interval}{sinks}, {args.new_tokens} new "
              f"tokens x batch {args.batch_size}, prompt {records[0]['prompt_tokens']} tokens, median of {args.repeats} "
              "interleaved repeats")
    print(header)
    print()
    print(table)
    if args.out:
        meta = {"model": args.model, "device": device, "fingerprint": foresight.model_fingerprint(model),
                "scorer": args.scorer, "scorer_sha256": scorer_sha, "policy_args": kwargs,
                "compile": args.compile}
        js, md = write_bench(args.out, meta, header, records)
        print(f"\nwrote {js}, {md}")
    return 0
