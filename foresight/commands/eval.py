"""``foresight eval``: fidelity of evicted caches on traces, and reasoning accuracy (AIME / MATH-500)."""

from __future__ import annotations

import sys
from pathlib import Path

from foresight.commands._common import add_model_args, parse_kv
from foresight.config import nonnegative_int, positive_int


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate policies: fidelity on traces, accuracy on AIME / MATH-500")
    evsub = p.add_subparsers(dest="eval_command", metavar="EVAL")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])

    f = evsub.add_parser("fidelity", help="loss ratio, ΔCE, KL and top-1 agreement of evicted vs full cache")
    add_model_args(f)
    f.add_argument("--traces", required=True, help="trace directory (`foresight trace` output)")
    f.add_argument("--policies", required=True, help="comma-separated policy names, e.g. full,random,h2o")
    f.add_argument("--budget", required=True, help="B, or several comma-separated: 128,256,512")
    f.add_argument("--interval", type=positive_int, required=True, help="W: new tokens between evictions")
    f.add_argument("--sinks", type=nonnegative_int, default=0, help="never evict the first S positions")
    f.add_argument("--scorer", default=None, help="scorer checkpoint for the `learned` policy")
    f.add_argument("--golden", default=None, help="golden label dir(s) for the `golden` policy")
    f.add_argument("--limit", type=positive_int, default=None, help="use only the first N traces")
    f.add_argument("--batch-size", type=positive_int, default=1, help="traces replayed together")
    f.add_argument("--ref-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="storage dtype of the full cache's reference log-probs")
    f.add_argument("--policy-arg", action="append", default=[], metavar="POLICY.KEY=VALUE",
                   help="hyperparameter of one policy (repeatable), e.g. --policy-arg random.seed=3")
    f.add_argument("--out", required=True, help="output directory (fidelity.json, fidelity.md, fidelity.png)")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.set_defaults(func=run_fidelity)

    from evaluation.accuracy import add_accuracy_args

    a = evsub.add_parser("aime", help="generate answers under a policy and grade them (pass@1)")
    add_model_args(a)
    add_accuracy_args(a)
    a.set_defaults(func=run_aime)


def _per_policy_kwargs(items: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for item in items:
        head, _, rest = item.partition("=")
        if "." not in head or not rest:
            raise ValueError(f"expected POLICY.KEY=VALUE, got {item!r}")
        policy, key = head.split(".", 1)
        out.setdefault(policy, {}).update(parse_kv([f"{key}={rest}"]))
    return out


def _check_trace_fingerprint(ds, model, source) -> None:
    from foresight.fingerprint import check_same_model

    if "fingerprint" not in ds.column_names:
        return
    for fp in sorted(set(ds["fingerprint"])):
        check_same_model(fp, model, f"traces in {source}",
                         fix="replay them with the model that generated them (--model)")


def run_fidelity(args) -> int:
    import torch

    import foresight
    from evaluation.fidelity import evaluate_fidelity
    from evaluation.policies import check_requirements, make_factory, parse_budgets, parse_policies
    from evaluation.report import write_fidelity_outputs
    from foresight.errors import ForesightError
    from golden.traces import load_traces

    names = parse_policies(args.policies)
    budgets = parse_budgets(args.budget, args.interval)
    check_requirements(names, args.scorer, args.golden)
    if args.limit is not None and args.limit <= 0:
        raise ForesightError(f"--limit must be positive, got {args.limit}")
    if args.batch_size <= 0:
        raise ForesightError(f"--batch-size must be positive, got {args.batch_size}")
    kwargs = _per_policy_kwargs(args.policy_arg)
    ds = load_traces(args.traces)
    if args.limit is not None:
        ds = ds.select(range(min(args.limit, len(ds))))
    model, _ = foresight.load_model(args.model, device=args.device, dtype=args.dtype)
    _check_trace_fingerprint(ds, model, args.traces)
    factory = make_factory(model=model, scorer=args.scorer, golden=args.golden, interval=args.interval,
                           policy_kwargs=kwargs)
    skipped = []

    def on_skip(name, budget, why):
        skipped.append(f"skipped {name} at B={budget}: {why}")
        print(f"note: {skipped[-1]}", file=sys.stderr)

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
    )
    if not records:
        raise ForesightError("nothing evaluated: " + "; ".join(skipped))
    out = Path(args.out)
    settings = {
        "model": args.model, "traces": str(args.traces), "num_traces": len(ds), "policies": names,
        "budgets": budgets, "interval": args.interval, "sinks": args.sinks, "scorer": args.scorer,
        "golden": args.golden, "fingerprint": foresight.model_fingerprint(model), "skipped": skipped,
    }
    notes = [f"model `{args.model}`, {len(ds)} traces from `{args.traces}`", *skipped]
    md = write_fidelity_outputs(records, out, notes=notes, settings=settings)
    print(md)
    print(f"wrote {out / 'fidelity.json'}, {out / 'fidelity.md'}, {out / 'fidelity.png'}")
    return 0


def run_aime(args) -> int:
    from evaluation.accuracy import run_from_args

    return run_from_args(args)
