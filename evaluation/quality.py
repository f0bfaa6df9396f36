"""The quality verdict of learned eviction: how much of the best-heuristic -> golden gap each learned stage closes.

Input: fidelity records (:func:`evaluation.fidelity.evaluate_fidelity`) of one (B, W) setting on a held-out split,
one per policy, each with the per-trace loss ratios of the same traces. Output, per learned stage (the method
section 5, "Statistics"):

* pooled loss ratio and mean of per-trace ratios, for every policy;
* the best heuristic (lowest pooled ratio among policies that are neither golden, full nor learned);
* ``gap_closed`` = (best heuristic - stage) / (best heuristic - golden), pooled ratios;
* the paired per-trace difference stage - best heuristic with a percentile-bootstrap 95% interval
  (:func:`evaluation.stats.paired_bootstrap`); an interval entirely below 0 means the stage beats the heuristic
  beyond trace-sampling noise (every interval resamples problems where a problem has several traces);
* the same paired difference between consecutive learned stages (e.g. SL -> SL+DAgger -> +GRPO), so each stage is
  credited with its own effect.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from foresight.errors import ForesightError
from evaluation.stats import gap_share_bootstrap, paired_bootstrap

REFERENCES = ("full", "golden")
RECORD_KEYS = ("per_trace_ratio", "tokens", "ce_full", "loss_ratio", "mean_trace_ratio")


def load_record(spec: str, budget: int, interval: int) -> tuple[dict, dict]:
    """``FILE:STAGE`` -> (the run's meta, the stage's fidelity record at (budget, interval)).

    ``FILE`` is a quality benchmark's ``quality.json`` (its ``meta``), or a ``foresight eval fidelity``
    ``fidelity.json`` (a list of records; the meta is the ``settings.json`` beside it, and ``STAGE`` the policy
    name, e.g. ``learned``)."""
    path, sep, stage = spec.rpartition(":")
    if not sep or not path or not stage:
        raise ForesightError(f"{spec!r}: expected FILE:STAGE, e.g. runs/q/quality.json:sl")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForesightError(f"{path}: not a readable quality.json or fidelity.json ({exc})") from None
    if isinstance(data, list):  # eval fidelity's output: the model is named by its settings.json
        settings = Path(path).with_name("settings.json")
        try:
            meta = json.loads(settings.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ForesightError(f"{settings}: a fidelity.json needs the settings.json written beside it ({exc})"
                                 ) from None
        if not isinstance(meta, dict) or "model" not in meta:
            raise ForesightError(f"{settings}: no 'model'")
        data = {"meta": meta, "records": data}
    if (not isinstance(data, dict) or not isinstance(data.get("meta"), dict)
            or not isinstance(data.get("records"), list) or not all(isinstance(r, dict) for r in data["records"])):
        raise ForesightError(f"{path}: not a quality.json (no 'meta' and 'records') or fidelity.json")
    found = [r for r in data["records"] if r.get("policy") == stage
             and (r.get("budget"), r.get("interval")) == (budget, interval)]
    if not found:
        names = sorted({str(r.get("policy")) for r in data["records"]})
        raise ForesightError(f"{path}: no record {stage!r} at B={budget} W={interval} (has {', '.join(names)})")
    if len(found) > 1:  # e.g. two runs' records merged by hand: which one a comparison used would be a guess
        raise ForesightError(f"{path}: {len(found)} records {stage!r} at B={budget} W={interval}; keep one")
    missing = [k for k in RECORD_KEYS if k not in found[0]]
    if missing:
        raise ForesightError(f"{path}: record {stage!r} has no {', '.join(missing)}")
    check_record_values(found[0], f"{path}: record {stage!r}")
    return data["meta"], found[0]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_record_values(rec: dict, where: str, finite: bool = True) -> None:
    """Refuse a record whose :data:`RECORD_KEYS` (those it has) are not numbers (per-trace ratios: a non-empty
    object of numbers), so a hand-edited or foreign file is one line, not a traceback in the arithmetic. With
    ``finite`` (every comparison) they must also be positive and finite: a NaN (``eval fidelity`` writes one where a
    trace or budget left no scored token) or a zero would otherwise surface as ``nan`` or a division error."""
    if "tokens" in rec and (not isinstance(rec["tokens"], int) or isinstance(rec["tokens"], bool)):
        raise ForesightError(f"{where}: 'tokens' must be an integer, got {rec['tokens']!r}")
    for k in ("ce_full", "loss_ratio", "mean_trace_ratio"):
        if k in rec and not _is_number(rec[k]):
            raise ForesightError(f"{where}: {k!r} must be a number, got {rec[k]!r}")
        if finite and k in rec and not (math.isfinite(rec[k]) and rec[k] > 0):  # CEs and their ratios
            raise ForesightError(f"{where}: {k!r} must be a positive finite number, got {rec[k]!r}")
    if "per_trace_ratio" not in rec:
        return
    ratios = rec["per_trace_ratio"]
    if not isinstance(ratios, dict) or not ratios:
        raise ForesightError(f"{where}: 'per_trace_ratio' must be a non-empty object of trace id -> ratio")
    bad = next((t for t, v in ratios.items() if not (_is_number(v) and (not finite or math.isfinite(v) and v > 0))),
               None)
    if bad is not None:
        kind = "a positive finite number" if finite else "a number"
        raise ForesightError(f"{where}: 'per_trace_ratio' of trace {bad!r} must be {kind}, got {ratios[bad]!r}")


def load_gap_references(gap: str, budget: int, interval: int) -> tuple[dict, tuple[str, dict], tuple[str, dict]]:
    """``FILE:HEURISTIC`` -> (the run's meta, (spec, heuristic record), (spec, golden record)) of one run, the two
    ends of the gap a stage's share is measured on (:func:`gap_share`)."""
    golden_spec = f"{gap.rpartition(':')[0]}:golden"
    if gap.rpartition(":")[2] == "golden":
        raise ForesightError(f"{gap!r}: the gap runs from a heuristic to golden; name the heuristic, e.g. FILE:tova")
    meta, best = load_record(gap, budget, interval)
    _, golden = load_record(golden_spec, budget, interval)
    return meta, (gap, best), (golden_spec, golden)


def check_comparable(meta_a: dict, a: dict, meta_b: dict, b: dict, a_name: str, b_name: str) -> None:
    """Refuse two stage records (:func:`load_record`) that do not come from the same model and traces: the
    full-cache CE does not depend on the policy, so a different value means different tokens or weights."""
    if meta_a.get("model") != meta_b.get("model"):
        raise ForesightError(f"{a_name} and {b_name}: measured on different models ({meta_a.get('model')!r} vs "
                             f"{meta_b.get('model')!r})")
    # attention sinks kept apart from the budget change what every policy keeps, not the full-cache CE below
    if a.get("sinks", 0) != b.get("sinks", 0):
        raise ForesightError(f"{a_name} and {b_name}: measured with different attention sinks ({a.get('sinks', 0)} vs "
                             f"{b.get('sinks', 0)}); compare runs of one setting")
    # 1e-4: the same traces give full-cache CEs that differ around 1e-5 when the runs used other thread counts
    # (fp32 reductions in another order: 0.606986 vs 0.606991 on the 48 benchmark traces, 1 vs 2 threads); other
    # traces or weights move it far more
    if a["tokens"] != b["tokens"] or not math.isclose(a["ce_full"], b["ce_full"], rel_tol=1e-4):
        raise ForesightError(f"{a_name} and {b_name}: different scored tokens or full-cache CE "
                             f"({a['tokens']} vs {b['tokens']} tokens, {a['ce_full']:.6f} vs {b['ce_full']:.6f}); "
                             "not the same traces or model")


def same_traces(a: dict, b: dict, a_name: str, b_name: str) -> list[str]:
    """The sorted trace ids two fidelity records share; refuses records measured on different traces."""
    if set(a["per_trace_ratio"]) != set(b["per_trace_ratio"]):
        raise ForesightError(f"{a_name} and {b_name} were measured on different traces; a paired comparison needs "
                             "the same")
    return sorted(a["per_trace_ratio"])


def problem_of(trace_id: str) -> str:
    """The problem a trace samples: its id without the ``#sample`` suffix (``golden.traces.trace_id``)."""
    return str(trace_id).rsplit("#", 1)[0]


def paired_difference(a: dict, b: dict, a_name: str, b_name: str, seed: int = 0, by_problem: bool = False) -> dict:
    """Paired per-trace difference ``a - b`` of two fidelity records' loss ratios with its bootstrap interval
    (:func:`evaluation.stats.paired_bootstrap`; ``by_problem`` resamples problems, for several traces per problem);
    refuses records measured on different traces."""
    ids = same_traces(a, b, a_name, b_name)
    ra, rb = a["per_trace_ratio"], b["per_trace_ratio"]
    groups = [problem_of(t) for t in ids] if by_problem else None
    return paired_bootstrap([ra[t] for t in ids], [rb[t] for t in ids], seed=seed, groups=groups)


def _paired(records: dict[str, dict], a: str, b: str, seed: int, by_problem: bool) -> dict:
    return paired_difference(records[a], records[b], a, b, seed, by_problem)


def gap_share(stage: dict, best: dict, golden: dict, names: tuple[str, str, str], seed: int = 0,
              by_problem: bool = False) -> dict:
    """The share of the ``best`` -> ``golden`` gap that ``stage`` closes, pooled (``pooled``) and on per-trace
    means with its bootstrap interval (:func:`evaluation.stats.gap_share_bootstrap`; ``by_problem`` resamples
    problems, as :func:`paired_difference` does); refuses records measured on different traces. ``names`` name the
    three records in errors."""
    for other, name in ((best, names[1]), (golden, names[2])):
        ids = same_traces(stage, other, names[0], name)
    s, w, g = ([r["per_trace_ratio"][t] for t in ids] for r in (stage, best, golden))
    gap = best["loss_ratio"] - golden["loss_ratio"]
    pooled = (best["loss_ratio"] - stage["loss_ratio"]) / gap if gap > 0 else math.nan
    groups = [problem_of(t) for t in ids] if by_problem else None
    return {**gap_share_bootstrap(s, w, g, seed=seed, groups=groups), "pooled": pooled}


def _gap_share(records: dict[str, dict], stage: str, best: str, seed: int, by_problem: bool) -> dict:
    """The share of the best-heuristic -> golden gap closed on per-trace means, with its bootstrap interval."""
    out = gap_share(records[stage], records[best], records["golden"], (stage, best, "golden"), seed, by_problem)
    out.pop("pooled")  # the summary records the pooled share as its own key (gap_closed)
    return out


def quality_summary(records: Sequence[dict], learned: Sequence[str], seed: int = 0) -> dict:
    """Summarise one setting's fidelity ``records``; ``learned`` names the learned stages in training order.

    Where a problem has several traces (:func:`problem_of`), the bootstrap intervals resample problems (the cluster
    bootstrap: its traces are not independent), and each interval records ``n_groups``."""
    by_name = {r["policy"]: r for r in records}
    if len(by_name) != len(records):
        raise ForesightError("two records for the same policy; pass one (B, W) setting at a time")
    missing = [n for n in ("golden", *learned) if n not in by_name]
    if missing:
        raise ForesightError(f"no fidelity record for {', '.join(missing)}")
    for name, rec in by_name.items():  # every row of the table, not only the ones paired below, on golden's traces
        if name != "golden" and "per_trace_ratio" in rec and "per_trace_ratio" in by_name["golden"]:
            same_traces(by_name["golden"], rec, "golden", name)
    heuristics = [n for n in by_name if n not in REFERENCES and n not in learned]
    if not heuristics:
        raise ForesightError("no heuristic policy to compare against")
    best = min(heuristics, key=lambda n: by_name[n]["loss_ratio"])
    golden = by_name["golden"]["loss_ratio"]
    gap = by_name[best]["loss_ratio"] - golden
    ids = list(by_name["golden"]["per_trace_ratio"])
    by_problem = len({problem_of(t) for t in ids}) < len(ids)
    stages = []
    for i, name in enumerate(learned):
        ratio = by_name[name]["loss_ratio"]
        stage = {
            "stage": name,
            "loss_ratio": ratio,
            "mean_trace_ratio": by_name[name]["mean_trace_ratio"],
            "gap_closed": (by_name[best]["loss_ratio"] - ratio) / gap if gap > 0 else math.nan,
            "gap_closed_per_trace": _gap_share(by_name, name, best, seed, by_problem),
            "vs_best_heuristic": _paired(by_name, name, best, seed, by_problem),
        }
        if i > 0:
            stage["vs_previous_stage"] = {"previous": learned[i - 1],
                                          **_paired(by_name, name, learned[i - 1], seed, by_problem)}
        stages.append(stage)
    first = records[0]
    return {
        "budget": first["budget"],
        "interval": first["interval"],
        "traces": first["traces"],
        "best_heuristic": best,
        "policies": {
            n: {"loss_ratio": r["loss_ratio"], "mean_trace_ratio": r["mean_trace_ratio"]} for n, r in by_name.items()
        },
        "stages": stages,
    }


def quality_markdown(summaries: Sequence[dict]) -> str:
    """One table per setting (every policy, pooled and per-trace mean), then the learned stages' verdicts."""
    out = []
    for s in summaries:
        groups = s["stages"][0]["vs_best_heuristic"].get("n_groups") if s["stages"] else None
        of = f" of {groups} problems; the intervals resample problems" if groups else ""
        out.append(f"### B={s['budget']}, W={s['interval']} ({s['traces']} held-out traces{of})\n")
        out.append("| policy | pooled loss ratio | mean per-trace ratio |\n|---|---:|---:|")
        for name, r in sorted(s["policies"].items(), key=lambda kv: kv[1]["loss_ratio"]):
            mark = " (best heuristic)" if name == s["best_heuristic"] else ""
            out.append(f"| {name}{mark} | {r['loss_ratio']:.4f} | {r['mean_trace_ratio']:.4f} |")
        out.append("\n| learned stage | gap closed (pooled) | gap closed, per-trace means [95% CI] "
                   "| paired Δ vs best heuristic [95% CI] | paired Δ vs previous stage |")
        out.append("|---|---:|---:|---:|---:|")
        for st in s["stages"]:
            v = st["vs_best_heuristic"]
            prev = st.get("vs_previous_stage")
            prev_s = f"{prev['mean']:+.4f} [{prev['ci_low']:+.4f}, {prev['ci_high']:+.4f}]" if prev else "-"
            g = st.get("gap_closed_per_trace")  # absent in summaries written before it existed; one decimal so that
            # a share near a target (60%) is never rounded across it
            gap_s = f"{g['share']:.1%} [{g['ci_low']:.1%}, {g['ci_high']:.1%}]" if g else "-"
            out.append(f"| {st['stage']} | {st['gap_closed']:.1%} | {gap_s} | {v['mean']:+.4f} [{v['ci_low']:+.4f}, "
                       f"{v['ci_high']:+.4f}] | {prev_s} |")
        out.append("")
    return "\n".join(out)


__all__ = ["check_comparable", "check_record_values", "gap_share", "load_gap_references", "load_record", "paired_difference", "problem_of", "quality_markdown", "quality_summary", "same_traces"]
