"""``foresight eval``: fidelity of evicted caches on traces, and reasoning accuracy (AIME / MATH-500)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from foresight.cli.args import (add_cache_args, add_model_args, add_policy_args, add_sampling_filter_args,
                                           fill_sampling_filters, policy_kwargs, refuse_unused_cache_args)
from foresight.config import ConfigError, nonnegative_float, nonnegative_int, positive_int, read_json, seed_int
from foresight.errors import ForesightError


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate policies: fidelity on traces, accuracy on AIME / MATH-500")
    evsub = p.add_subparsers(dest="eval_command", metavar="EVAL")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])

    f = evsub.add_parser("fidelity", help="loss ratio, ΔCE, KL and top-1 agreement of evicted vs full cache")
    add_model_args(f)
    f.add_argument("--traces", required=True, help="trace directory (`foresight trace` output)")
    f.add_argument("--policies", required=True, help="comma-separated policy names, e.g. full,random,h2o")
    # several budgets share one W (there is no single B // 4), and a budget is what fidelity is measured at
    add_cache_args(f, budget_required=True, interval_required=True, several_budgets=True)
    f.add_argument("--scorer", default=None, help="scorer checkpoint for the `learned` policy")
    f.add_argument("--golden", default=None, help="golden label dir(s) for the `golden` policy")
    f.add_argument("--limit", type=positive_int, default=None, help="use only the first N traces")
    f.add_argument("--batch-size", type=positive_int, default=1, help="traces replayed together")
    f.add_argument("--score-from", type=nonnegative_int, default=0, metavar="N",
                   help="score positions >= max(B+W, N) only: give every budget the positions of the largest "
                   "B+W to compare budgets with each other")
    f.add_argument("--ref-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="storage dtype of the full cache's reference log-probs")
    add_policy_args(f, several=True)
    f.add_argument("--out", required=True, help="output directory (fidelity.json, fidelity.md, fidelity.png)")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.set_defaults(func=run_fidelity)

    a = evsub.add_parser("aime", help="generate answers under a policy and grade them (pass@1)")
    add_model_args(a)
    add_accuracy_args(a)
    a.set_defaults(func=run_aime)


AIME_TOP_P, AIME_TOP_K = 0.95, 20  # recorded in settings.json (a resumed run must record the same)


def add_accuracy_args(p) -> None:
    p.add_argument("--data", default="aime24", help="aime24, aime25, math500, synthetic or a JSONL path")
    add_policy_args(p)
    p.add_argument("--scorer", default=None, help="scorer checkpoint for the `learned` policy")
    add_cache_args(p)
    p.add_argument("--samples", type=positive_int, default=1, help="samples per problem (pass@1 = mean over them)")
    p.add_argument("--temperature", type=nonnegative_float, default=0.6, help="0 = greedy")
    add_sampling_filter_args(p, top_p=AIME_TOP_P, top_k=AIME_TOP_K)
    p.add_argument("--max-new-tokens", type=positive_int, default=32768)
    p.add_argument("--batch-size", type=positive_int, default=8, help="samples generated together")
    p.add_argument("--limit", type=positive_int, default=None, help="first N problems only")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--template", default=None, help="prompt template (text or file) with {problem}")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_trace_fingerprint(ds, model, source) -> None:
    from foresight.fingerprint import check_same_model

    if "fingerprint" not in ds.column_names:
        return
    for fp in sorted(set(ds["fingerprint"])):
        check_same_model(fp, model, f"traces in {source}",
                         fix="replay them with the model that generated them (--model)")


# settings.json keys a rerun into a finished --out must match; the fingerprint (model and adapter) is compared once
# the model has loaded, and keys that older results lack are compared where the results record them
FIDELITY_SAME = ("model", "traces", "num_traces", "policies", "budgets", "interval", "sinks", "scorer",
                 "scorer_sha256", "golden", "policy_args", "batch_size", "ref_dtype", "score_from", "fingerprint",
                 "dtype")
RECORDED_LATER = ("scorer_sha256", "batch_size", "ref_dtype", "score_from", "dtype")


def _shown(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _same_folder(a, b) -> bool:
    """Two spellings of one trace folder (relative and absolute, ``./`` or a trailing slash), resolved from here."""
    return isinstance(a, str) and isinstance(b, str) and Path(a).resolve() == Path(b).resolve()


def _check_finished_out(out: Path, settings: dict) -> None:
    """Refuse an ``--out`` holding the finished results (``fidelity.json`` and its ``settings.json``) of another
    evaluation, which the run would overwrite; the same evaluation again is fine (it rewrites the same results).
    Only the keys in ``settings`` are compared (the fingerprint in a second call, after the model loads);
    ``RECORDED_LATER`` keys where the results record them, and ``policy_args``, for runs before it was recorded, as
    the policies' ``policy_config`` in the records, key by key for the keys this run sets."""
    results = out / "fidelity.json"
    if not results.exists():
        return
    fix = f"choose a new --out or remove {results}"
    where = out / "settings.json"
    try:
        records = read_json(results, "finished results", expect=list)
        recorded = read_json(where, f"the settings of {results}:", expect=dict)
    except ConfigError as exc:
        raise ForesightError(f"--out {out}: {exc}; {fix}") from None
    now = json.loads(json.dumps(settings, default=str))  # as settings.json stores it
    for key in FIDELITY_SAME:
        if key not in now or (key in RECORDED_LATER and key not in recorded):
            continue
        if key == "policy_args" and key not in recorded:  # written before policy_args was recorded
            for policy, given in now[key].items():
                for rec in records:
                    cfg = rec.get("policy_config") if isinstance(rec, dict) and rec.get("policy") == policy else None
                    for k, v in given.items() if isinstance(cfg, dict) else ():
                        if k in cfg and not isinstance(cfg[k], (dict, list)) and cfg[k] != v:
                            raise ForesightError(
                                f"--out {out} holds the results of another evaluation ({results}: {policy}.{k} "
                                f"{_shown(cfg[k])}, this run {_shown(v)}); {fix}")
            continue
        if recorded.get(key) != now[key] and not (key == "traces" and _same_folder(recorded.get(key), now[key])):
            raise ForesightError(f"--out {out} holds the results of another evaluation ({where}: {key} "
                                 f"{_shown(recorded.get(key))}, this run {_shown(now[key])}); {fix}")


def run_fidelity(args) -> int:
    import torch

    import foresight
    from evaluation.fidelity import evaluate_fidelity
    from evaluation.fidelity_journal import rank_done_note, remove_journal
    from evaluation.policies import (check_requirements, golden_factory, make_factory, parse_budgets,
                                     parse_policies)
    from evaluation.report import FIDELITY_OUTPUT, write_fidelity_outputs
    from foresight.limits import check_context
    from foresight.outputs import check_output, prepare_output_dir
    from foresight.policies import checked_policy
    from foresight.schedule import cache_config_arg
    from foresight.scorer import scorer_sha256
    from golden.sharding import rank_world
    from golden.traces import load_traces

    rank, world = rank_world()  # a launcher's environment (RANK/WORLD_SIZE): this rank replays its share of batches
    names = parse_policies(args.policies)
    budgets = parse_budgets(args.budget, args.interval)
    kwargs = policy_kwargs(args, names)
    check_requirements(names, args.scorer, args.golden, kwargs)
    if args.limit is not None and args.limit <= 0:
        raise ForesightError(f"--limit must be positive, got {args.limit}")
    if args.batch_size <= 0:
        raise ForesightError(f"--batch-size must be positive, got {args.batch_size}")
    check_output(args.out, FIDELITY_OUTPUT)  # before the model loads: a file, or a directory of something else
    for b in budgets:  # sinks past B - W: refused at the first replay, after the model load, before
        cache_config_arg(b, args.interval, args.sinks,
                         flags=f"--budget {b} --interval {args.interval} --sinks {args.sinks}")
    for name in names:  # hyperparameters and B, W (paged's block): before the model loads (golden: with its labels)
        if name not in ("learned", "golden"):
            checked_policy(name, [(b, args.interval) for b in budgets], f"policy {name!r}", **kwargs[name])
    if "learned" in names:  # a scorer trained at another B, W (without any_budget): before the model loads
        checked_policy("learned", [(b, args.interval) for b in budgets], "policy 'learned'",
                       scorer=args.scorer, **kwargs["learned"])
    labels_for = None
    if "golden" in names:  # labels missing or made for another B, W: read now (once), not after the model load
        labels_for = golden_factory(args.golden, args.interval)
        for b in budgets:
            labels_for(b)
    ds = load_traces(args.traces)
    if args.limit is not None:
        ds = ds.select(range(min(args.limit, len(ds))))
    # the weights measured, by hash, read before any compute (a short name can later point at newer weights)
    scorer_sha = scorer_sha256(args.scorer) if args.scorer else None
    settings = {
        "model": args.model, "traces": str(args.traces), "num_traces": len(ds), "policies": names,
        "budgets": budgets, "interval": args.interval, "sinks": args.sinks, "scorer": args.scorer,
        "scorer_sha256": scorer_sha, "golden": args.golden, "policy_args": kwargs, "batch_size": args.batch_size,
        "ref_dtype": args.ref_dtype, "score_from": args.score_from,
    }
    out = Path(args.out)
    _check_finished_out(out, settings)  # before the model loads: a finished --out of another evaluation is kept
    model, _ = foresight.load_model(args.model, device=args.device, dtype=args.dtype,
                                    adapter=args.adapter)
    _check_trace_fingerprint(ds, model, args.traces)
    check_context(model, max(map(len, ds["input_ids"])), f"the longest trace of --traces {args.traces}",
                  "replay traces made by this model")  # before anything is written
    settings["fingerprint"] = foresight.model_fingerprint(model)  # the adapter too, which no argument above shows
    settings["dtype"] = str(model.dtype).removeprefix("torch.")  # resolved: --dtype's default differs by device
    _check_finished_out(out, {k: settings[k] for k in ("fingerprint", "dtype")})  # the rest: before the load
    factory = make_factory(model=model, scorer=args.scorer, golden=labels_for, interval=args.interval,
                           policy_kwargs=kwargs)
    skipped = []

    def on_skip(name, budget, why):
        skipped.append(f"skipped {name} at B={budget}: {why}")
        print(f"note: {skipped[-1]}", file=sys.stderr)

    prepare_output_dir(out, FIDELITY_OUTPUT)
    journal = out / "fidelity.partial.jsonl"  # a killed run resumes from it; deleted once the results are written
    records = evaluate_fidelity(
        model,
        ds["input_ids"],
        names,
        budgets,
        args.interval,
        trace_ids=ds["trace_id"],
        policy_factory=factory,
        sinks=args.sinks,
        batch_size=args.batch_size,
        ref_dtype=getattr(torch, args.ref_dtype),
        progress=not args.quiet,
        on_skip=on_skip,
        journal=journal,
        score_from=args.score_from,
        rank=rank,
        world_size=world,
    )
    if world > 1:  # the results are written once, by a run in one process that finds every rank's batches
        print(rank_done_note(rank, world, out))
        return 0
    if not records:
        raise ForesightError("nothing evaluated: " + "; ".join(skipped))
    settings["skipped"] = skipped
    notes = [f"model `{args.model}`, {len(ds)} traces from `{args.traces}`", *skipped]
    for b in budgets:  # a trace of at most B + W + 1 tokens has no prediction after the first eviction
        counted = next((r["traces"] for r in records if r["budget"] == b), len(ds))
        if counted < len(ds):
            notes.append(f"B={b}: {len(ds) - counted} of {len(ds)} traces are too short to reach the first eviction "
                         f"(at most B + W + 1 = {b + args.interval + 1} tokens) and are left out of its numbers")
    md = write_fidelity_outputs(records, out, notes=notes, settings=settings)
    remove_journal(journal)
    print(md)
    print(f"wrote {out / 'fidelity.json'}, {out / 'fidelity.md'}, {out / 'fidelity.png'}")
    return 0


def run_aime(args) -> int:
    """Generate answers under one policy and grade them (:func:`evaluation.accuracy.run_accuracy`)."""
    import foresight
    from evaluation.accuracy import AIME_OUTPUT, check_gradable, format_summary, run_accuracy
    from evaluation.policies import check_requirements, make_factory
    from foresight.data import load_problems
    from foresight.limits import check_planned
    from foresight.outputs import check_output
    from foresight.prompts import load_template
    from foresight.policies.base import require_cache
    from foresight.runtime import CacheConfig
    from foresight.scorer import scorer_sha256
    from golden.sharding import rank_world
    from golden.traces import check_greedy_samples

    fill_sampling_filters(args, top_p=AIME_TOP_P, top_k=AIME_TOP_K)
    check_greedy_samples(args.samples, args.temperature, ("--samples ", "--temperature "), "answer")
    if args.policy == "golden":
        raise ForesightError("the golden policy replays fixed traces; it cannot generate (use `eval fidelity`)")
    kwargs = policy_kwargs(args)[args.policy]
    if args.policy == "learned" and "scorer" in kwargs:  # `generate`'s spelling: --policy-arg scorer=DIR
        if args.scorer is not None:
            raise ForesightError(f"--scorer {args.scorer} and --policy-arg scorer={kwargs['scorer']}: give the "
                                 "scorer once")
        args.scorer = str(kwargs.pop("scorer"))
    check_requirements([args.policy], args.scorer, None, {args.policy: kwargs})
    factory = make_factory(scorer=args.scorer, policy_kwargs={args.policy: kwargs})
    policy = factory(args.policy, args.budget or 0)
    if policy.evicts and args.budget is None:
        raise ForesightError(f"policy {args.policy!r} evicts: pass --budget (and --interval)")
    refuse_unused_cache_args(args, policy)  # the full cache would be kept, yet settings would record the budget
    try:
        cfg = CacheConfig(args.budget if policy.evicts else None, args.interval, args.sinks)
    except ValueError as exc:
        raise ForesightError(str(exc)) from None
    if policy.evicts:  # e.g. a scorer trained at another B, W: found after the model load before
        require_cache(policy, cfg.budget, cfg.interval)
    load_template(args.template)  # a missing template file, or one without {problem}, before the model loads
    problems = load_problems(args.data, limit=args.limit)
    check_gradable(problems, args.data)
    check_planned(len(problems), args.samples)
    check_output(args.out, AIME_OUTPUT)  # before the model loads, not after it
    scorer_sha = scorer_sha256(args.scorer) if args.scorer else None  # the weights sampled with, by hash
    rank, world = rank_world()  # the launcher's environment, before the model loads
    model, tok = foresight.load_model(args.model, device=args.device, dtype=args.dtype,
                                      adapter=args.adapter)
    if args.scorer:
        check = getattr(getattr(policy, "model", None), "check_compatible", None)
        if callable(check):
            check(model)
    settings = {
        "model": args.model, "data": args.data, "policy": args.policy, "policy_kwargs": kwargs,
        "scorer": args.scorer, "scorer_sha256": scorer_sha, "budget": cfg.budget, "interval": cfg.interval,
        "sinks": args.sinks,
        "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "template": args.template,
        "batch_size": args.batch_size, "limit": args.limit, "world_size": world,
        "fingerprint": foresight.model_fingerprint(model), "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),  # resolved: --dtype's default differs by device
    }
    summary = run_accuracy(
        model, tok, problems, args.out, policy=policy, settings=settings, samples=args.samples,
        batch_size=args.batch_size, rank=rank, world_size=world, progress=not args.quiet,
    )
    print(format_summary(summary))
    print(f"wrote {Path(args.out) / 'summary.json'}")
    return 0
