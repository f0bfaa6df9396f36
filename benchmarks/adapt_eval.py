"""Base vs adapted model under eviction on held-out traces: the measurement of `foresight train adapt`.

Loads the base model, attaches a `foresight train adapt` adapter unmerged, and replays the base model's traces
under each policy once with the adapter disabled and once enabled (:mod:`evaluation.adapted`, the computation the
trainer's held-out evaluation uses): loss ratio and KL of both (each against its own full cache), the paired
per-trace difference adapted - base with a bootstrap 95% interval, and the adapted model's full-cache CE relative
to the base's. Writes ``adapt_eval.json`` and ``adapt_eval.md`` under ``--out``.

    python benchmarks/adapt_eval.py --adapter runs/adapt/adapter --traces runs/quality/heldout_traces \
        --policies learned,h2o,lazy --scorer smollm2-135m-b64-w16 --budget 64 --interval 16 --out runs/adapt/eval

The adapter must have been trained by `foresight train adapt` on this model (its ``foresight_adapter.json``); with
``learned`` in play, ``--scorer`` must be the very scorer it was trained under (weights SHA-256), unless
``--other-scorer`` says a different one is meant (a transfer measurement). ``--adapted-scorer`` evicts the adapted
side with a scorer trained *for the adapted model* (``foresight train sl adapter=<the adapter>``: docs/
4b, the scorer alternated with the adapter), so the comparison is system against system: base model with its
scorer vs adapted model with its own. That scorer's fingerprint must carry this very adapter.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from evaluation.adapted import compare_adapted, fidelity_by_policy
from evaluation.policies import check_own_inputs, make_factory, parse_policies
from foresight.cli.args import parse_policy_args
from foresight.adapters import attach_adapter, read_adapter_config, read_training_meta
from foresight.config import nonnegative_int, positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.models import load_model
from foresight.output_paths import check_output_dir
from foresight.policies import checked_policy
from foresight.schedule import cache_config_arg
from foresight.scorer import resolve_scorer, scorer_sha256
from training.adapt import base_model_traces, longer_than


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", required=True, help="`foresight train adapt` output (<out_dir>/adapter)")
    p.add_argument("--traces", required=True, help="the base model's held-out traces (`foresight trace` output)")
    p.add_argument("--policies", required=True, help="comma-separated evicting policies, e.g. learned,h2o,lazy")
    p.add_argument("--scorer", default=None, help="scorer of `learned` (dir or shipped name)")
    p.add_argument("--other-scorer", action="store_true",
                   help="allow a scorer other than the one the adapter was trained under")
    p.add_argument("--adapted-scorer", default=None,
                   help="scorer of `learned` on the adapted side: one trained for the adapted model "
                        "(`foresight train sl adapter=...`); default: --scorer on both sides")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--interval", type=int, required=True)
    p.add_argument("--sinks", type=nonnegative_int, default=0)
    p.add_argument("--policy-arg", action="append", default=[], metavar="[POLICY.]KEY=VALUE")
    p.add_argument("--max-traces", type=nonnegative_int, default=0, help="the first N traces (0 = all)")
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def _check_inputs(args, policies: list[str]) -> dict:
    """Everything that can be refused before the model loads; returns the adapter's training record."""
    read_adapter_config(args.adapter)  # peft files present and readable
    meta = read_training_meta(args.adapter)
    if meta is None:
        raise ForesightError(f"--adapter {args.adapter}: no foresight_adapter.json; this measurement is for "
                             "adapters trained by `foresight train adapt`")
    bad = [p for p in policies if p in ("full", "golden")]
    if bad:
        raise ForesightError(f"--policies: {bad[0]!r} does not evict at decode time; name evicting policies")
    if "learned" in policies:
        if not args.scorer:
            raise ForesightError("--scorer is required with the learned policy")
        sha = scorer_sha256(args.scorer)
        if meta.get("scorer_sha256") not in (None, sha) and not args.other_scorer:
            raise ForesightError(f"--scorer {args.scorer} is not the scorer the adapter was trained under "
                                 f"({meta.get('scorer')}); pass --other-scorer to measure a transfer")
        if args.adapted_scorer:
            resolve_scorer(args.adapted_scorer)  # present and readable; its model is checked once the adapter is on
    else:
        for flag, given in (("--scorer", args.scorer), ("--adapted-scorer", args.adapted_scorer)):
            if given:  # unused, yet it would be recorded with the results
                raise ForesightError(f"{flag}: only the learned policy uses a scorer; add learned to --policies or "
                                     f"drop {flag}")
    if (meta.get("budget"), meta.get("interval")) != (args.budget, args.interval):
        print(f"note: the adapter was trained at B={meta.get('budget')} W={meta.get('interval')}, evaluated at "
              f"B={args.budget} W={args.interval}", flush=True)
    return meta


def _table(metrics: dict, policies: list[str], meta: dict, n: int, args) -> str:
    lines = [f"Adapter {args.adapter} (trained under {meta.get('policy')} at B={meta.get('budget')} "
             f"W={meta.get('interval')}), evaluated at B={args.budget} W={args.interval} on {n} traces of "
             f"{args.traces}.", ""]
    if args.adapted_scorer:
        lines += [f"`learned` evicts the base model with {args.scorer} and the adapted model with its own scorer "
                  f"{args.adapted_scorer}.", ""]
    lines += ["| policy | loss ratio, base | loss ratio, adapted | adapted - base, per trace [95% CI] |",
              "|---|---:|---:|---:|"]
    for p in policies:
        lines.append(f"| {p} | {metrics[f'{p}_loss_ratio_base']:.4f} | {metrics[f'{p}_loss_ratio_adapted']:.4f} | "
                     f"{metrics[f'{p}_vs_base_mean']:+.4f} [{metrics[f'{p}_vs_base_ci_low']:+.4f}, "
                     f"{metrics[f'{p}_vs_base_ci_high']:+.4f}] |")
    lines += ["", f"Full-cache CE: base {metrics['full_ce_base']:.4f}, adapted {metrics['full_ce_adapted']:.4f} "
              f"(ratio {metrics['full_ce_ratio']:.4f})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    policies = parse_policies(args.policies)
    kwargs = parse_policy_args(args.policy_arg, policies)
    # W >= B (or sinks past B - W) failed in the first replay, after the model load
    cache_config_arg(args.budget, args.interval, args.sinks, flags="--budget/--interval/--sinks")
    check_output_dir(args.out, "--out")  # written after the whole evaluation
    check_own_inputs(policies, kwargs)  # a scorer as --policy-arg beside --scorer: a TypeError traceback
    cache = [(args.budget, args.interval)]
    for name in (p for p in policies if p != "learned"):
        checked_policy(name, cache, f"policy {name!r}", **kwargs[name])
    meta = _check_inputs(args, policies)
    if "learned" in policies:  # each scorer takes this B and W (else refused after the whole base-side replay)
        selections = {f"{flag} {scorer}": checked_policy("learned", cache, f"{flag} {scorer}", scorer=scorer,
                                                         **kwargs["learned"]).applied_selection
                      for flag, scorer in (("--scorer", args.scorer), ("--adapted-scorer", args.adapted_scorer))
                      if scorer}
        if len(set(selections.values())) > 1:  # each scorer's recorded default: sampled against top-k, silently
            raise ForesightError(f"the two scorers run learned with different default selections ("
                                 f"{', '.join(f'{k}: {v}' for k, v in selections.items())}); choose one for both "
                                 "with --policy-arg selection=topk or selection=sample")
    out = Path(args.out)
    t0 = time.time()
    base, _ = load_model(args.model)
    rows = base_model_traces(args.traces, base, fix="evaluate on traces generated by the base model")
    rows = longer_than(rows, args.budget + args.interval, args.traces)
    if args.max_traces:
        rows = rows[: args.max_traces]
    factory = make_factory(model=base, scorer=args.scorer, interval=args.interval, policy_kwargs=kwargs)
    if "learned" in policies:
        factory("learned", args.budget)  # the scorer is checked against the base model before any replay
    peft_model = attach_adapter(base, args.adapter, merge=False)  # checks the adapter's base fingerprint
    lm = peft_model.get_base_model()
    # The adapter was trained with the base model's identity in its replay (its scorer is the base's): present it
    # the same way here; the adapter's own identity is recorded in the output instead.
    adapter_identity = lm.config.foresight_adapter
    # A scorer trained for the adapted model (--adapted-scorer) is checked against, and replayed with, its identity.
    adapted_factory, adapted_identity = factory, None
    if args.adapted_scorer:
        adapted_identity = adapter_identity
        adapted_factory = make_factory(model=lm, scorer=args.adapted_scorer, interval=args.interval,
                                       policy_kwargs=kwargs)
        adapted_factory("learned", args.budget)
    lm.config.foresight_adapter = None
    peft_model.eval()
    with peft_model.disable_adapter():
        base_recs = fidelity_by_policy(lm, rows, policies, args.budget, args.interval, args.sinks, factory,
                                       batch_size=args.batch_size, progress=True)
    lm.config.foresight_adapter = adapted_identity
    adapted = fidelity_by_policy(lm, rows, policies, args.budget, args.interval, args.sinks, adapted_factory,
                                 batch_size=args.batch_size, progress=True)
    metrics = compare_adapted(base_recs, adapted, seed=args.seed)
    out.mkdir(parents=True, exist_ok=True)
    result = {"meta": {"model": args.model, "adapter": str(args.adapter), "adapter_identity": adapter_identity,
                       "adapter_training": {k: meta.get(k) for k in ("policy", "budget", "interval", "scorer",
                                                                      "scorer_sha256")},
                       "traces": str(args.traces), "num_traces": len(rows), "policies": policies,
                       "scorer": args.scorer, "scorer_sha256": scorer_sha256(args.scorer) if args.scorer else None,
                       "adapted_scorer": args.adapted_scorer,
                       "adapted_scorer_sha256": scorer_sha256(args.adapted_scorer)
                       if args.adapted_scorer else None, "budget": args.budget, "interval": args.interval,
                       "sinks": args.sinks, "policy_kwargs": kwargs, "minutes": round((time.time() - t0) / 60, 1)},
              "metrics": metrics, "base": list(base_recs.values()), "adapted": list(adapted.values())}
    (out / "adapt_eval.json").write_text(json.dumps(result, indent=2, default=str))
    md = _table(metrics, policies, meta, len(rows), args)
    (out / "adapt_eval.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    run_script(main, "adapt_eval")
