"""The scaling curve: held-out loss ratio of the distilled scorer against the number of training traces.

Reads ``quality.json`` files written by ``benchmarks/quality/run.py`` (one or several runs on the *same* held-out
traces and setting) and plots, per learned stage named ``<label>_<N>`` (N = training traces, e.g. ``sl_120``),
its pooled loss ratio against N, with the best heuristic and golden of the same run as horizontal lines.

    python benchmarks/quality/scaling.py runs/q/quality_B64/quality.json runs/q/scaling_B64/quality.json \
        --out runs/quality_B64/scaling.png
"""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure

from evaluation.quality import check_comparable, load_record, same_traces
from foresight.config import read_json
from foresight.errors import ForesightError, OneLineParser, run_script

STAGE = re.compile(r"^(?P<label>.+)_(?P<n>\d+)$")


def _number(value, path: str, name: str) -> float:
    """A summary's ratio, refused unless a number (a string would be plotted as a category, or fail to print)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ForesightError(f"{path}: the summary's loss ratio of {name} must be a number, got {value!r}")
    return value


def collect(paths: list[str]) -> tuple[dict, dict[str, list[tuple[int, float, float]]]]:
    """The first run's summary (reference lines) and, per stage label, (N, pooled, mean per-trace) points. Every
    file must be a quality.json of one setting on the same model and held-out traces as the first (its golden
    record's trace ids, scored tokens and full-cache CE), else the curve would mix held-out sets."""
    ref, curves, shape, golden = None, {}, None, None
    for path in paths:
        data = read_json(path, "quality.json")
        summaries = data.get("summaries")
        if not isinstance(summaries, list) or not all(isinstance(s, dict) for s in summaries):
            raise ForesightError(f"{path}: not a quality.json (no 'summaries')")
        try:
            for s in summaries:
                key = (s["budget"], s["interval"], s["traces"])
                if shape is None:
                    shape, ref = key, s
                    if not {"golden", s["best_heuristic"]} <= set(s["policies"]):  # the reference lines
                        raise ForesightError(f"{path}: its summary has no golden or best-heuristic entry")
                elif key != shape:
                    raise ForesightError(f"{path}: setting/traces {key} differ from the first file's {shape}; "
                                         "a curve needs one held-out set")
                meta, rec = load_record(f"{path}:golden", *key[:2])
                if golden is None:
                    golden = (f"{path}:golden", meta, rec)
                else:
                    check_comparable(golden[1], golden[2], meta, rec, golden[0], f"{path}:golden")
                    same_traces(golden[2], rec, golden[0], f"{path}:golden")
                for value, name in ((s["policies"]["golden"]["loss_ratio"], "golden"),
                                    (s["policies"][s["best_heuristic"]]["loss_ratio"], s["best_heuristic"])):
                    _number(value, path, name)
                for st in s["stages"]:
                    m = STAGE.match(st["stage"])
                    if m:
                        curves.setdefault(m["label"], []).append((int(m["n"]), _number(st["loss_ratio"], path, m[0]),
                                                                  _number(st["mean_trace_ratio"], path, m[0])))
        except (KeyError, TypeError) as exc:
            raise ForesightError(f"{path}: not a quality.json summary (missing or malformed {exc})") from None
    if ref is None or not curves:
        raise ForesightError("no stage named <label>_<N> in the given files")
    curves = {k: sorted(set(v)) for k, v in curves.items()}  # the same stage given twice counts once
    for label, pts in curves.items():
        ns = [n for n, _, _ in pts]
        twice = next((n for n in ns if ns.count(n) > 1), None)
        if twice is not None:  # two runs of one N would be drawn as one curve through both
            raise ForesightError(f"stage {label}_{twice}: two different results in the given files; give one run "
                                 "per number of training traces, or name the stages apart")
    return ref, curves


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
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
    ns = sorted({n for pts in curves.values() for n, _, _ in pts})
    ax.set_xticks(ns, [str(n) for n in ns])  # the measured Ns, written plainly (log-axis minor labels overlap)
    ax.minorticks_off()
    ax.set_xlabel("training traces")
    ax.set_ylabel("held-out loss ratio (lower is better)")
    ax.set_title(f"B={ref['budget']}, W={ref['interval']}, {ref['traces']} held-out traces")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(args.out)
    if out.is_dir():
        raise ForesightError(f"--out {out}: is a directory; name the plot file, e.g. {out / 'scaling.png'}")
    if not out.suffix:  # matplotlib would write OUT.png, not the file named
        raise ForesightError(f"--out {out}: name the plot with its format's suffix, e.g. {out.with_suffix('.png')}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    except (OSError, ValueError) as exc:
        raise ForesightError(f"--out {out}: cannot write the plot ({exc})") from None
    for label, pts in curves.items():
        print(label, ", ".join(f"N={n}: {r:.4f}" for n, r, _ in pts))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "scaling")
