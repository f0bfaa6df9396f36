"""The scaling curve: held-out loss ratio of the distilled scorer against the number of training traces.

Reads ``quality.json`` files written by ``benchmarks/quality/run.py`` (one or several runs on the *same* held-out
traces and setting) and plots, per learned stage named ``<label>_<N>`` (N = training traces, e.g. ``sl_120``),
its pooled loss ratio against N, with the best heuristic and golden of the same run as horizontal lines.

    python benchmarks/quality/scaling.py runs/q/quality_B64/quality.json runs/q/scaling_B64/quality.json \
        --out benchmarks/results/quality_B64/scaling.png
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from matplotlib.figure import Figure

STAGE = re.compile(r"^(?P<label>.+)_(?P<n>\d+)$")


def collect(paths: list[str]) -> tuple[dict, dict[str, list[tuple[int, float, float]]]]:
    """The first run's summary (reference lines) and, per stage label, (N, pooled, mean per-trace) points."""
    ref, curves, shape = None, {}, None
    for path in paths:
        data = json.loads(Path(path).read_text())
        for s in data["summaries"]:
            key = (s["budget"], s["interval"], s["traces"])
            if shape is None:
                shape, ref = key, s
            elif key != shape:
                raise SystemExit(f"{path}: setting/traces {key} differ from the first file's {shape}; "
                                 "a curve needs one held-out set")
            for st in s["stages"]:
                m = STAGE.match(st["stage"])
                if m:
                    curves.setdefault(m["label"], []).append((int(m["n"]), st["loss_ratio"], st["mean_trace_ratio"]))
    if ref is None or not curves:
        raise SystemExit("no stage named <label>_<N> in the given files")
    return ref, {k: sorted(set(v)) for k, v in curves.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="quality.json files of one held-out set and setting")
    p.add_argument("--out", required=True, help="the plot (.png)")
    args = p.parse_args(argv)
    ref, curves = collect(args.files)
    fig = Figure(figsize=(6, 4.2))
    ax = fig.add_subplot()
    for label, pts in curves.items():
        ax.plot([n for n, _, _ in pts], [r for _, r, _ in pts], "o-", label=f"{label} (pooled)")
        ax.plot([n for n, _, _ in pts], [m for _, _, m in pts], "x--", alpha=0.6, label=f"{label} (mean per trace)")
    best = ref["best_heuristic"]
    ax.axhline(ref["policies"][best]["loss_ratio"], color="tab:red", ls=":", label=f"{best} (best heuristic)")
    ax.axhline(ref["policies"]["golden"]["loss_ratio"], color="goldenrod", ls=":", label="golden (oracle)")
    ax.set_xscale("log")
    ax.set_xlabel("training traces")
    ax.set_ylabel("held-out loss ratio (lower is better)")
    ax.set_title(f"B={ref['budget']}, W={ref['interval']}, {ref['traces']} held-out traces")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    for label, pts in curves.items():
        print(label, ", ".join(f"N={n}: {r:.4f}" for n, r, _ in pts))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
