"""Human-readable reports of fidelity records: a markdown table sorted by quality and a loss-ratio plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import matplotlib
from matplotlib.figure import Figure

from foresight.atomic import atomic_file, atomic_write_text
from foresight.outputs import OutputKind, prepare_output_dir

#: ``eval fidelity``'s output directory (``card_fidelity.json``: the demo's card records beside its results).
FIDELITY_OUTPUT = OutputKind("eval fidelity", ("fidelity.json", "fidelity.md", "fidelity.png", "settings.json",
                                               "fidelity.partial.jsonl", "card_fidelity.json"),
                             (("fidelity.json", "settings.json"), ("fidelity.partial.jsonl",)))


def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _quality_key(rec: dict):
    """Best first: lowest loss ratio, then lowest KL (NaN last)."""
    lr, kl = rec.get("loss_ratio", float("nan")), rec.get("kl", float("nan"))
    return (math.isnan(lr), lr if not math.isnan(lr) else 0.0, math.isnan(kl), kl if not math.isnan(kl) else 0.0)


def fidelity_table(records: Sequence[dict]) -> str:
    """Markdown table: one block per budget (tokens and % of the mean trace length), best policy first."""
    head = (
        "| budget (tokens) | budget (% of mean trace) | policy | loss ratio | ΔCE (nats/token) | "
        "KL(full‖evicted) | top-1 agreement | tokens |\n"
        "|---:|---:|---|---:|---:|---:|---:|---:|"
    )
    rows = []
    for budget in sorted({r["budget"] for r in records}):
        block = sorted((r for r in records if r["budget"] == budget), key=_quality_key)
        for r in block:
            frac = r.get("budget_frac")
            pct = f"{100 * frac:.0f}%" if frac is not None else "n/a"
            delta = _fmt(r["delta_ce"])
            if not math.isnan(r.get("delta_ce_se", float("nan"))):
                delta += f" ± {r['delta_ce_se']:.4f}"
            rows.append(
                f"| {budget} | {pct} | {r['policy']} | {_fmt(r['loss_ratio'])} | {delta} | {_fmt(r['kl'])} | "
                f"{_fmt(r['top1_agreement'], 3)} | {r['tokens']} |"
            )
    return "\n".join([head, *rows])


def fidelity_markdown(records: Sequence[dict], title: str = "Fidelity", notes: Sequence[str] = ()) -> str:
    """A whole report page: title, notes, the table and a legend of the metrics."""
    interval = sorted({r["interval"] for r in records})
    sinks = sorted({r.get("sinks", 0) for r in records})  # kept apart from the budget: every policy keeps them
    mean_len = records[0].get("mean_trace_len") if records else None
    lines = [f"# {title}", ""]
    lines += [f"- {n}" for n in notes]
    lines.append(f"- interval W = {', '.join(map(str, interval))}"
                 + (f"; attention sinks S = {', '.join(map(str, sinks))} (never evicted)" if any(sinks) else "")
                 + f"; mean trace length = {_fmt(mean_len, 1)} tokens")
    lines += [
        "- metrics pooled over every position ≥ B + W (predictions made after the first eviction); best policy "
        "first within each budget (lowest loss ratio). ΔCE (pooled over tokens) is ± its standard error over traces (each weighed by its scored tokens).",
        "",
        fidelity_table(records),
        "",
    ]
    return "\n".join(lines)


# Lines that carry the story get a fixed look; every other policy takes the next colour of a 20-colour cycle.
_HIGHLIGHT = {"full": dict(color="black", ls=":", lw=1.2), "golden": dict(color="goldenrod", ls="--", lw=2.0)}


def plot_loss_ratio(records: Sequence[dict], path: str | Path, title: str = "Loss ratio vs budget") -> Path:
    """PNG of loss ratio against budget, one line per policy (matplotlib's object API: no pyplot, so no
    backend is chosen or changed for the caller).

    Learned scorers are drawn thick, the oracle dashed, the full cache dotted; the legend (outside the axes)
    lists policies best first at the smallest budget, so it reads like the table.
    """
    path = Path(path)
    series = {}
    for policy in {r["policy"] for r in records}:
        pts = sorted((r["budget"], r["loss_ratio"]) for r in records if r["policy"] == policy)
        pts = [(b, v) for b, v in pts if not math.isnan(v)]
        if pts:
            series[policy] = pts
    order = sorted(series, key=lambda p: (series[p][0][1], p))
    palette = matplotlib.colormaps["tab20"].colors
    fig = Figure(figsize=(7.6, 4.2), dpi=120)
    ax = fig.subplots()
    k = learned = 0
    for policy in order:
        style = _HIGHLIGHT.get(policy)
        if style is None:
            style = dict(color=palette[(2 * k) % 20 + (k // 10) % 2], lw=1.3)
            k += 1
            if policy.startswith("learned"):
                style.update(lw=3.0, zorder=3, ls=("-", "-.", "--")[learned % 3])
                learned += 1
        pts = series[policy]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, label=policy, **style)
    ax.set_xticks(sorted({b for pts in series.values() for b, _ in pts}))
    ax.set_xlabel("budget B (KV entries per layer and head)")
    ax.set_ylabel("loss ratio  CE_evicted / CE_full")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


__all__ = ["fidelity_markdown", "fidelity_table", "plot_loss_ratio"]


def write_fidelity_outputs(records: Sequence[dict], out_dir: str | Path, notes: Sequence[str] = (),
                           title: str = "Fidelity of evicted caches", settings: dict | None = None) -> str:
    """Write ``fidelity.json``, ``fidelity.md``, ``fidelity.png`` (and ``settings.json``) into ``out_dir``.

    Returns the markdown page. Shared by ``foresight eval fidelity`` and the demo. Every file is written atomically.
    """
    out = prepare_output_dir(out_dir, FIDELITY_OUTPUT)
    # settings first: a rerun reads a present fidelity.json (and its settings.json) as finished results
    if settings is not None:
        atomic_write_text(out / "settings.json", json.dumps(settings, indent=2, default=str) + "\n")
    atomic_write_text(out / "fidelity.json", json.dumps(list(records), indent=2) + "\n")
    md = fidelity_markdown(records, title=title, notes=notes)
    atomic_write_text(out / "fidelity.md", md)
    with atomic_file(out / "fidelity.png") as tmp:
        plot_loss_ratio(records, tmp, title=title)
    return md
