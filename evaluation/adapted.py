"""Base vs adapted fidelity under eviction: what a LoRA adapter trained under a policy buys (DESIGN.md section 4b).

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

from typing import Callable, Sequence

from evaluation.fidelity import evaluate_fidelity
from evaluation.stats import paired_bootstrap


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
        ids = sorted(set(b["per_trace_ratio"]) & set(a["per_trace_ratio"]))
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


__all__ = ["compare_adapted", "fidelity_by_policy"]
