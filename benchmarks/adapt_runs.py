"""Two `foresight train adapt` runs on the same data order, compared step by step on their training metrics.

Runs with the same traces, seed, batch and world size see the very same traces at every step (the sampler's
order does not depend on the learning rate, rank or step count), so their logged training metrics pair up by
step. Each ``kind: train`` record of ``metrics.jsonl`` is one ``log_every`` window: ``loss`` is the window's mean
over all its steps and ranks, the other metrics are its last step's. The per-window differences ``a - b`` remove
the trace-to-trace variation both runs share (a long, hard trace is hard for both); their mean gets a bootstrap
95% interval over windows (:func:`evaluation.stats.paired_bootstrap`). This says, within a training run's time,
whether a change (rank, learning rate, anchor weight) trains better on the same data; whether it generalises is
the held-out measurement's job (`benchmarks/adapt_eval.py`).

    python benchmarks/adapt_runs.py runs/quality/adapt_s16b_B64 runs/adapt_B64_W16_s13 \
        --plot runs/quality/adapt_s16b_vs_s13.png

Each run's settings come from its newest checkpoint, else from its adapter's ``foresight_adapter.json`` (so a
results directory holding ``metrics.jsonl`` and that file compares too). Refused (exit 2): runs whose settings
differ in anything that sets the data order or the eviction (traces, seed, split, batch, world size, policy,
scorer, B, W; traces, scorer and world size only when both runs record them the same way); ``--metric loss``
across different objectives (``anchor_weight``, ``ce_weight``); and any paired window whose teacher CE
(``ce_full``, a function of the base model and the batch alone) differs by more than 0.1% or whose count of scored
positions differs: the two runs did not see the same traces there. ``--metric loss`` (a window's mean) also needs
every paired window to span the same steps: runs logged at another ``log_every`` do not, nor does the first window
of a run resumed from a checkpoint between two records (it averages the steps after the checkpoint only, and its
record says so: ``window_from``; runs before that record do not show it).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from evaluation.stats import paired_bootstrap
from foresight.adapters import TRAINING_META, read_training_meta
from foresight.config import nonnegative_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_file
from training.checkpoint import find_latest, latest_step
from training.logging import read_metrics

# checkpoint settings that decide which traces a step sees and how the cache evicts them
# (``steps`` only sets the learning-rate schedule: the sampler's order depends on the seed, batch and world size)
SAME_DATA = ("traces", "seed", "split_seed", "heldout", "max_traces", "micro_batch", "world_size", "policy",
             "policy_kwargs", "scorer", "budget", "interval", "sinks", "model", "dtype")
# settings that change what the logged ``loss`` is made of
SAME_OBJECTIVE = ("anchor_weight", "ce_weight")
OBJECTIVE_DEFAULTS = {"anchor_weight": 0.0, "ce_weight": 0.0}  # runs from before the anchor term had none
BY_SOURCE = ("traces", "scorer", "world_size")  # recorded in different forms by checkpoints and adapters
METRICS = ("loss", "kl", "loss_ratio", "ce_evicted", "top1_agreement")
CE_RTOL = 1e-3  # the teacher replay in one piece or in W pieces differs by ~1e-5


def run_settings(run: str | Path) -> tuple[str, dict]:
    """``(source, settings)`` of a run: its newest checkpoint's training settings (``"checkpoint"``), else the
    ``config`` of its adapter's ``foresight_adapter.json`` (``"adapter"``, in ``RUN/adapter/`` or ``RUN/``, as a
    results directory keeps it), with the scorer named by its weights' SHA-256. ``ForesightError`` when neither."""
    run = Path(run)
    if latest_step(run) is not None:
        return "checkpoint", dict(find_latest(run, who="run settings")[1]["settings"])
    for where in (run / "adapter", run):
        meta = read_training_meta(where)  # one line, exit 2, when it is not JSON
        if meta is not None:
            if not isinstance(meta.get("config"), dict):
                raise ForesightError(f"{where / TRAINING_META}: no training config (not written by `foresight train "
                                     "adapt`)")
            return "adapter", {**meta["config"], "scorer": meta.get("scorer_sha256"), "traces": meta.get("traces")}
    raise ForesightError(f"{run}: neither a checkpoint nor {TRAINING_META} (needed to check that the runs saw the "
                         "same data)")


def train_records(run: str | Path) -> dict[int, dict]:
    """The ``kind: train`` records of a run's ``metrics.jsonl``, by step."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise ForesightError(f"{path}: not found")
    try:
        records = read_metrics(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForesightError(f"{path}: not readable ({exc})") from None
    out = {}
    for i, r in enumerate(records, 1):
        if not isinstance(r, dict) or not isinstance(r.get("step"), int):
            raise ForesightError(f"{path}: line {i} is not a metrics record with an integer 'step'")
        if r.get("kind") == "train":
            out[r["step"]] = r
    return out


def check_comparable(a: tuple[str, dict], b: tuple[str, dict], metric: str, names: tuple[str, str]) -> list[str]:
    """Refuse two runs whose settings do not give the same data order (and, for ``loss``, the same objective);
    returns the settings that could not be checked (a checkpoint names the scorer and traces by content digests
    and records the world size; an adapter's record names them by path and SHA-256 and does not)."""
    keys = SAME_DATA + (SAME_OBJECTIVE if metric == "loss" else ())
    unchecked = [] if a[0] == b[0] else list(BY_SOURCE)
    sa, sb = ({**OBJECTIVE_DEFAULTS, **x[1]} for x in (a, b))
    for key in keys:
        if key in unchecked:
            continue
        if sa.get(key) != sb.get(key):
            why = "the logged loss is a different objective" if key in SAME_OBJECTIVE else \
                "the runs did not see the same traces at each step"
            raise ForesightError(f"setting {key!r} differs: {names[0]} has {sa.get(key)!r}, {names[1]} has "
                                 f"{sb.get(key)!r} ({why}; compare --metric kl across objectives)")
    return unchecked


def window_starts(records: dict[int, dict]) -> dict[int, int]:
    """The first step each logged window averages ``loss`` over: the step after the run's previous record, or the
    record's ``window_from`` (written after a resume between two records, when the window is shorter)."""
    steps = sorted(records)
    return {s: records[s].get("window_from") or (prev + 1 if prev is not None else 1)
            for prev, s in zip([None, *steps], steps)}


def paired_windows(ra: dict[int, dict], rb: dict[int, dict], metric: str, names: tuple[str, str]) -> list[tuple]:
    """``(step, a, b)`` for every step both runs logged, after checking each window's teacher CE agrees; for
    ``loss`` (a window's mean) both windows must also span the same steps: runs logged at other intervals
    (``log_every``) were paired as if they had, a mean over two steps against one step's."""
    steps = sorted(set(ra) & set(rb))
    if metric == "loss":
        wa, wb = window_starts(ra), window_starts(rb)
        other = next((s for s in steps if wa[s] != wb[s]), None)
        if other is not None:
            raise ForesightError(f"step {other}: the logged loss of {names[0]} is the mean of steps {wa[other]}-"
                                 f"{other}, of {names[1]} of steps {wb[other]}-{other} (another log_every); compare "
                                 "--metric kl (each window's last step) or runs logged alike")
    if len(steps) < 2:
        raise ForesightError(f"{names[0]} and {names[1]} share {len(steps)} logged training step(s); need 2 or more")
    out = []
    for s in steps:
        x, y = ra[s], rb[s]
        for name, rec in zip(names, (x, y)):
            for key in (metric, "ce_full"):
                v = rec.get(key)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ForesightError(f"{name}/metrics.jsonl: step {s} has no finite {key!r} (got {v!r})")
        cx, cy = x["ce_full"], y["ce_full"]
        if not math.isclose(cx, cy, rel_tol=CE_RTOL, abs_tol=1e-9):
            raise ForesightError(f"step {s}: teacher CE {cx} in {names[0]} vs {cy} in {names[1]}; the runs did not "
                                 "see the same traces there")
        if x.get("positions") != y.get("positions"):
            raise ForesightError(f"step {s}: {x.get('positions')} scored positions in {names[0]} vs "
                                 f"{y.get('positions')} in {names[1]}; the runs did not see the same traces there")
        out.append((s, float(x[metric]), float(y[metric])))
    return out


def compare(run_a: str | Path, run_b: str | Path, metric: str = "loss", seed: int = 0) -> dict:
    """The paired comparison of two runs' training ``metric``: per-window values, mean difference a - b with its
    bootstrap interval, and the ratio of the means."""
    if metric not in METRICS:
        raise ForesightError(f"--metric {metric!r}: choose one of {', '.join(METRICS)}")
    names = (str(run_a), str(run_b))
    unchecked = check_comparable(run_settings(run_a), run_settings(run_b), metric, names)
    rows = paired_windows(train_records(run_a), train_records(run_b), metric, names)
    a, b = [r[1] for r in rows], [r[2] for r in rows]
    stats = paired_bootstrap(a, b, seed=seed)
    return {"a": names[0], "b": names[1], "metric": metric, "windows": len(rows),
            "steps": [r[0] for r in rows], "values_a": a, "values_b": b,
            "mean_a": sum(a) / len(a), "mean_b": sum(b) / len(b), "ratio_of_means": sum(a) / sum(b),
            "a_lower": sum(x < y for x, y in zip(a, b)), "unchecked_settings": unchecked,
            **{f"diff_{k}": v for k, v in stats.items()}}


def markdown(res: dict) -> str:
    head = (f"`{res['metric']}` by training window, A = {res['a']}, B = {res['b']} ({res['windows']} windows, "
            f"same traces at every step)\n\n| step | A | B | A - B |\n|---:|---:|---:|---:|\n")
    body = "".join(f"| {s} | {x:.4f} | {y:.4f} | {x - y:+.4f} |\n"
                   for s, x, y in zip(res["steps"], res["values_a"], res["values_b"]))
    tail = (f"\nmean A {res['mean_a']:.4f}, mean B {res['mean_b']:.4f} (A/B {res['ratio_of_means']:.3f}); paired "
            f"A - B {res['diff_mean']:+.4f} [{res['diff_ci_low']:+.4f}, {res['diff_ci_high']:+.4f}]; A lower in "
            f"{res['a_lower']} of {res['windows']} windows\n")
    if res["unchecked_settings"]:
        tail += (f"\nnot checked (one run records them by checkpoint digest, the other by adapter record): "
                 f"{', '.join(res['unchecked_settings'])}; every window's teacher CE agrees, so the traces do\n")
    return head + body + tail


def check_plot_file(path: str | Path | None) -> None:
    """Refuse, before any work, a ``--plot`` file matplotlib would not write under its name: an unknown suffix
    (a traceback after the tables were printed and the JSON written) or none (matplotlib writes ``PATH.png``)."""
    if path is None:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    if Path(path).suffix.lstrip(".").lower() not in kinds:
        raise ForesightError(f"--plot {path}: name the image with a suffix matplotlib writes "
                             f"({', '.join(sorted(kinds))}), e.g. {Path(path).with_suffix('.png')}")


def plot(res: dict, path: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(res["steps"], res["values_a"], "o-", label=f"A: {Path(res['a']).name}")
    ax.plot(res["steps"], res["values_b"], "s--", label=f"B: {Path(res['b']).name}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"training {res['metric']} (same traces per step)")
    ax.set_title(f"A - B {res['diff_mean']:+.4f} [{res['diff_ci_low']:+.4f}, {res['diff_ci_high']:+.4f}]")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", help="a `foresight train adapt` out_dir")
    p.add_argument("run_b", help="another one, trained on the same data order")
    p.add_argument("--metric", default="loss", help=f"one of {', '.join(METRICS)} (default loss: the window mean)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed")
    p.add_argument("--json", default=None, help="also write the result as JSON here")
    p.add_argument("--plot", default=None, help="also draw both curves into this PNG")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_output_file(args.json, "--json")
    check_output_file(args.plot, "--plot")
    check_plot_file(args.plot)
    res = compare(args.run_a, args.run_b, args.metric, args.seed)
    print(markdown(res), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if args.plot:
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    run_script(main, "adapt_runs")
