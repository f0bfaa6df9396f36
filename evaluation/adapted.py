"""Base vs adapted fidelity under eviction: what a LoRA adapter trained under a policy buys (docs/training.md, adaptation).

One computation for ``foresight train adapt``'s held-out evaluation and ``benchmarks/adapt_eval.py``: replay the
same traces through the same :class:`peft.PeftModel` once with its adapter disabled (``base``) and once enabled
(``adapted``) under each policy (:func:`evaluation.fidelity.evaluate_fidelity`), then report per policy the loss
ratio and KL of both, the paired per-trace loss-ratio difference adapted - base with a bootstrap 95% interval
(:func:`evaluation.stats.paired_bootstrap`), and the full-cache CE of the adapted model relative to the base's (the
adapter must not make the uncompressed model worse). Each model's loss ratio is relative to its *own* full cache.

Anchors: LoRA (Hu et al. 2021, https://arxiv.org/abs/2106.09685); Dynamic Memory Sparsification
(https://arxiv.org/abs/2506.05345) trains a model under the compression it will run with.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from evaluation.fidelity import evaluate_fidelity
from evaluation.quality import check_comparable, paired_difference
from evaluation.stats import paired_bootstrap
from foresight.errors import ForesightError

#: ``adapt_eval.py`` settings two measurements must share to be paired (the model, traces and eviction).
SAME_SETTINGS = ("model", "budget", "interval", "sinks", "num_traces")


def fidelity_by_policy(lm, rows: Sequence[dict], policies: Sequence[str], budget: int, interval: int, sinks: int,
                       factory: Callable, batch_size: int = 1, progress: bool = False) -> dict[str, dict]:
    """``evaluate_fidelity`` records of ``rows`` (trace dicts) under ``policies`` at one (B, W), by policy name."""
    recs = evaluate_fidelity(lm, [list(map(int, r["input_ids"])) for r in rows], list(policies), [budget], interval,
                             trace_ids=[r["trace_id"] for r in rows], policy_factory=factory, sinks=sinks,
                             batch_size=batch_size, progress=progress)
    return {r["policy"]: r for r in recs}


def compare_adapted(base: dict[str, dict], adapted: dict[str, dict], seed: int = 0, prefix: str = "") -> dict:
    """Flat metrics of adapted vs base records (both from :func:`fidelity_by_policy`, same traces and policies).

    Per policy ``{prefix}{policy}_loss_ratio_base`` / ``_adapted``, ``_kl_base`` / ``_kl_adapted`` and the paired
    per-trace difference adapted - base ``_vs_base_mean`` / ``_ci_low`` / ``_ci_high``; then ``{prefix}full_ce_base``,
    ``full_ce_adapted`` and their ratio ``full_ce_ratio`` (from the first policy's records: the full cache is the
    same replay for every policy).
    """
    if list(base) != list(adapted):
        raise ValueError(f"base and adapted records cover different policies: {list(base)} vs {list(adapted)}")
    out: dict = {}
    for name in base:
        b, a = base[name], adapted[name]
        ids = sorted(b["per_trace_ratio"])
        if ids != sorted(a["per_trace_ratio"]):  # pooled ratios of two trace sets would be compared as one
            raise ValueError(f"{name}: base and adapted records cover different traces "
                             f"({len(ids)} vs {len(a['per_trace_ratio'])}, "
                             f"{len(set(ids) ^ set(a['per_trace_ratio']))} on one side only)")
        diff = paired_bootstrap([a["per_trace_ratio"][i] for i in ids], [b["per_trace_ratio"][i] for i in ids],
                                seed=seed) if ids else {}
        out.update({f"{prefix}{name}_loss_ratio_base": b["loss_ratio"],
                    f"{prefix}{name}_loss_ratio_adapted": a["loss_ratio"],
                    f"{prefix}{name}_kl_base": b["kl"], f"{prefix}{name}_kl_adapted": a["kl"],
                    f"{prefix}{name}_vs_base_mean": diff.get("mean"),
                    f"{prefix}{name}_vs_base_ci_low": diff.get("ci_low"),
                    f"{prefix}{name}_vs_base_ci_high": diff.get("ci_high")})
    first = next(iter(base))
    ce_b, ce_a = base[first]["ce_full"], adapted[first]["ce_full"]
    out[f"{prefix}full_ce_base"] = ce_b
    out[f"{prefix}full_ce_adapted"] = ce_a
    out[f"{prefix}full_ce_ratio"] = ce_a / ce_b if ce_b else float("nan")
    return out


def gap_removed(adapted: float, base: float) -> float:
    """The share of the loss-ratio gap to 1.0 that adaptation removed: ``1 - (adapted - 1) / (base - 1)``."""
    return 1.0 - (adapted - 1.0) / (base - 1.0) if base != 1.0 else float("nan")


def _summary(base: dict, adapted: dict) -> dict:
    """One adapter's pooled numbers under one policy. ``vs_base_full_cache``: the adapted model's evicted CE over
    the *base* model's full-cache CE (its own loss ratio times its full-cache CE ratio), the number that counts any
    change the adapter made to the uncompressed model against it."""
    ratio, ce_ratio = adapted["loss_ratio"], adapted["ce_full"] / base["ce_full"]
    return {"loss_ratio_base": base["loss_ratio"], "loss_ratio_adapted": ratio,
            "gap_removed": gap_removed(ratio, base["loss_ratio"]), "full_ce_ratio": ce_ratio,
            "vs_base_full_cache": ratio * ce_ratio,
            "gap_removed_vs_base_full_cache": gap_removed(ratio * ce_ratio, base["loss_ratio"])}


def compare_adapters(a: dict, b: dict, policy: str, a_name: str, b_name: str, seed: int = 0,
                     systems: bool = False) -> dict:
    """Paired per-trace comparison ``a - b`` of two adapters' loss ratios under ``policy``, each measured by
    ``benchmarks/adapt_eval.py`` (``a`` and ``b``: its JSON output, ``{"meta", "base", "adapted"}``).

    The measurements must share the model, traces and eviction: the settings in ``SAME_SETTINGS`` and the policy's
    hyperparameters and scorer must agree, and their *base* records (adapter disabled: the same model, traces and
    policy give the same replay) must have the same scored tokens, full-cache CE and pooled loss ratio; anything
    else raises :class:`ForesightError` naming what differs. The scorer that must agree is the base side's; an
    adapted side may evict with a scorer trained for its adapted model (``adapt_eval.py --adapted-scorer``), and
    the result names each side's (``a_adapted_scorer``, ``b_adapted_scorer``). ``systems=True`` compares two
    systems (adapter + scorer) whose base sides evict with different scorers too: the base records must still
    come from the same model and traces (scored tokens, full-cache CE), and their own paired difference is
    returned as ``base_paired``. Returns each adapter's pooled numbers (:func:`_summary`), the paired per-trace
    difference with a bootstrap 95% interval and how many traces ``a`` is lower on.
    """
    recs = {}
    for name, data in ((a_name, a), (b_name, b)):
        found = [{r.get("policy"): r for r in data[kind]}.get(policy) for kind in ("base", "adapted")]
        if None in found:
            measured = ", ".join(map(str, data["meta"].get("policies") or []))
            raise ForesightError(f"{name}: no {policy!r} record (measured: {measured})")
        recs[name] = found
    ma, mb = a["meta"], b["meta"]
    settings = {k: (ma.get(k), mb.get(k)) for k in SAME_SETTINGS}
    settings[f"policy_kwargs.{policy}"] = tuple((m.get("policy_kwargs") or {}).get(policy, {}) for m in (ma, mb))
    if policy == "learned" and not systems:  # by weights where both recorded them (a short name can move)
        key = "scorer_sha256" if ma.get("scorer_sha256") and mb.get("scorer_sha256") else "scorer"
        settings[key] = (ma.get(key), mb.get(key))
    for key, (va, vb) in settings.items():
        if va != vb:
            hint = " (two systems with different scorers: --systems)" if key in ("scorer", "scorer_sha256") else ""
            raise ForesightError(f"{a_name} and {b_name}: measured with different {key} ({va!r} vs {vb!r}); a "
                                 f"paired comparison needs the same model, traces and eviction{hint}")
    (base_a, ad_a), (base_b, ad_b) = recs[a_name], recs[b_name]
    check_comparable(ma, base_a, mb, base_b, f"{a_name} (base)", f"{b_name} (base)")
    if not systems and not math.isclose(base_a["loss_ratio"], base_b["loss_ratio"], rel_tol=1e-4):
        raise ForesightError(f"{a_name} and {b_name}: the base model's {policy} loss ratio differs "
                             f"({base_a['loss_ratio']:.6f} vs {base_b['loss_ratio']:.6f}); not the same eviction "
                             "(two systems with different scorers: --systems)")
    diff = paired_difference(ad_a, ad_b, a_name, b_name, seed)
    base_diff = {"base_paired": paired_difference(base_a, base_b, a_name, b_name, seed)} if systems else {}
    ra, rb = ad_a["per_trace_ratio"], ad_b["per_trace_ratio"]
    return {"a": a_name, "b": b_name, "policy": policy, "budget": ma.get("budget"), "interval": ma.get("interval"),
            "a_summary": _summary(base_a, ad_a), "b_summary": _summary(base_b, ad_b), "paired": diff,
            "a_lower": sum(ra[t] < rb[t] for t in ra), **base_diff,
            **({f"{side}_adapted_scorer": m.get("adapted_scorer") or m.get("scorer")
                for side, m in (("a", ma), ("b", mb))} if policy == "learned" else {}),
            **({f"{side}_base_scorer": _scorer_label(m) for side, m in (("a", ma), ("b", mb))} if systems else {})}


def _scorer_label(meta: dict) -> str:
    """The eviction scorer of an ``adapt_eval.py`` output: its path or name, and its weights' SHA-256 prefix where
    recorded (older outputs record it only for the scorer the adapter was trained under)."""
    sha = meta.get("scorer_sha256")
    training = meta.get("adapter_training") or {}
    if not sha and training.get("scorer") == meta.get("scorer"):
        sha = training.get("scorer_sha256")
    return f"{meta.get('scorer')} ({sha[:8]}…)" if sha else str(meta.get("scorer"))


__all__ = ["SAME_SETTINGS", "compare_adapted", "compare_adapters", "fidelity_by_policy", "gap_removed"]
