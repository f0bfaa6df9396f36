"""The quality benchmark: every heuristic, golden and each learned stage on a fixed held-out split, with statistics.

Usage (one command; see benchmarks/quality/README.md for the whole recipe)::

    python benchmarks/quality/run.py --model smollm2-135m --traces runs/quality/heldout_traces \
        --setting 64:16=runs/quality/golden_B64_W16 --setting 128:32=runs/quality/golden_B128_W32 \
        --scorer sl=runs/quality/sl_B64 --scorer sl=runs/quality/sl_B128 --out runs/quality

For each (B, W) setting it replays every held-out trace under every policy (:mod:`evaluation.fidelity`) and writes
``quality.json`` (summaries + raw per-trace records), ``quality.md`` (tables) and ``quality.png`` (a plot) via
:mod:`evaluation.quality`: pooled loss ratio and mean of per-trace ratios per policy, the share of the
best-heuristic -> golden gap each learned stage closes, and paired per-trace differences with bootstrap 95%
intervals (stage vs best heuristic, stage vs previous stage). A learned stage's scorer directories are matched to
settings by the B and W recorded in their config; ``--scorer`` may be repeated per stage. Traces are split by
problem: ``--heldout-ids`` (one problem id per line) keeps only those problems' traces. Every finished batch of
traces is journalled in ``--out`` (``partial_B{B}_W{W}.jsonl``): rerun the same command after a crash and it
resumes where it stopped, with the numbers of an uninterrupted run. With ``RANK``/``WORLD_SIZE`` set (as
``recipe.sh`` runs it on two cores), each rank replays its share of the batches into its own journal file; the
same command run once more in one process replays nothing and writes the results, exactly an unsharded run's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from evaluation.fidelity import evaluate_fidelity  # noqa: E402
from evaluation.fidelity_journal import journal_files, rank_done_note, remove_journal  # noqa: E402
from evaluation.policies import golden_factory, make_factory  # noqa: E402
from foresight.cli.args import parse_policy_args  # noqa: E402
from evaluation.quality import REFERENCES, quality_markdown, quality_summary  # noqa: E402
from foresight.config import nonnegative_int, positive_int, read_text  # noqa: E402
from foresight.errors import ForesightError, OneLineParser, run_script  # noqa: E402
from foresight.models import load_model, model_fingerprint  # noqa: E402
from foresight.policies import checked_policy, make_policy  # noqa: E402
from foresight.schedule import cache_config_arg  # noqa: E402
from foresight.scorer import Scorer, scorer_sha256  # noqa: E402
from golden.sharding import rank_world  # noqa: E402
from golden.traces import load_traces  # noqa: E402

HEURISTICS = ["random", "streaming_llm", "h2o", "tova", "snapkv", "rkv", "keydiff", "lazy", "paged"]


def _setting(text: str) -> tuple[int, int, str]:
    try:
        bw, golden = text.split("=", 1)
        b, w = (int(x) for x in bw.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--setting {text!r}: expected B:W=GOLDEN_DIR, e.g. 64:16=runs/golden")
    return b, w, golden


def _scorer(text: str) -> tuple[str, str]:
    stage, sep, path = text.partition("=")
    if not sep or not stage or not path:
        raise argparse.ArgumentTypeError(f"--scorer {text!r}: expected STAGE=SCORER_DIR, e.g. sl=runs/sl/scorer")
    return stage, path


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--traces", required=True, help="held-out traces (`foresight trace` output)")
    p.add_argument("--setting", type=_setting, action="append", required=True, metavar="B:W=GOLDEN_DIR")
    p.add_argument("--scorer", type=_scorer, action="append", default=[], metavar="STAGE=DIR",
                   help="a learned stage's scorer (repeat per stage and setting), in training order")
    p.add_argument("--policies", default=",".join(HEURISTICS), help="heuristics to compare (comma-separated)")
    p.add_argument("--policy-arg", action="append", default=[], metavar="[POLICY_OR_STAGE.]KEY=VALUE",
                   help="a heuristic's or a learned stage's hyperparameter (repeatable; the grammar of every "
                   "`foresight` command), e.g. --policy-arg sl_sample.selection=sample --policy-arg lazy.seed=1")
    p.add_argument("--heldout-ids", default=None, help="keep only traces of these problem ids (one per line)")
    p.add_argument("--max-traces", type=nonnegative_int, default=0,
                   help="evaluate the first N held-out traces (0 = all)")
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def _stage_dirs(scorers: list[tuple[str, str]]) -> tuple[list[str], dict[tuple[str, int, int], str]]:
    """Stages in the order first named, and (stage, B, W) -> scorer dir from each scorer's recorded config."""
    stages, dirs = [], {}
    for stage, path in scorers:
        cfg = Scorer.from_pretrained(path).config
        key = (stage, cfg.budget, cfg.interval)
        if key in dirs:
            raise ForesightError(f"--scorer: two scorers for stage {stage!r} at B={cfg.budget} W={cfg.interval}")
        dirs[key] = path
        if stage not in stages:
            stages.append(stage)
    return stages, dirs


def _plot(summaries: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(1, len(summaries), figsize=(6 * len(summaries), 4.5), squeeze=False)
    for ax, s in zip(axes[0], summaries):
        items = sorted(s["policies"].items(), key=lambda kv: kv[1]["loss_ratio"])
        names = [n for n, _ in items]
        stages = {st["stage"] for st in s["stages"]}
        colors = ["goldenrod" if n == "golden" else "tab:blue" if n in stages else
                  "tab:red" if n == s["best_heuristic"] else "tab:gray" for n in names]
        ax.barh(names, [r["loss_ratio"] - 1 for _, r in items], left=1, color=colors)
        ax.scatter([r["mean_trace_ratio"] for _, r in items], names, color="black", s=12, zorder=3,
                   label="mean of per-trace ratios")
        ax.invert_yaxis()
        ax.set_xlabel("loss ratio (CE evicted / CE full), pooled; lower is better")
        ax.set_title(f"B={s['budget']}, W={s['interval']}, {s['traces']} held-out traces")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _check_finished_out(out: Path, now: dict, settings: list[tuple[int, int]]) -> None:
    """Refuse an ``--out`` holding the finished ``quality.json`` of another benchmark (other model, traces, scorer
    weights, policies, hyperparameters or settings), which this run would overwrite; the same benchmark again is
    fine (it rewrites the same results)."""
    path = out / "quality.json"
    if not path.is_file():
        return
    try:
        data = json.loads(path.read_text())
        meta = data["meta"]
        done = sorted((int(s["budget"]), int(s["interval"])) for s in data["summaries"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ForesightError(f"--out {out}: {path} is not a readable quality.json ({exc}); choose a new --out or "
                             "remove it") from None
    theirs = {**{k: meta.get(k) for k in now}, "settings": done}
    for key, value in {**now, "settings": settings}.items():
        if json.loads(json.dumps(value)) != json.loads(json.dumps(theirs[key])):
            raise ForesightError(f"--out {out} holds the finished results of another benchmark ({path}: {key} "
                                 f"differs); choose a new --out or remove {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ForesightError(f"--out {out} exists and is not a directory")
    settings_bw = [(b, w) for b, w, _ in args.setting]
    if len(set(settings_bw)) < len(settings_bw):
        raise ForesightError(f"--setting: B:W given twice ({', '.join(f'{b}:{w}' for b, w in settings_bw)})")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    # the summary needs one record per policy and a heuristic to measure the gap from: refused now, not after
    # every replay
    twice = sorted({p for p in policies if policies.count(p) > 1} | ({"golden"} & set(policies)))
    if twice:
        raise ForesightError(f"--policies: {', '.join(twice)} named twice (golden is always evaluated)")
    if "learned" in policies:  # checked as a heuristic, it failed after every check for want of a scorer
        raise ForesightError("--policies: learned is not a heuristic here; measure a scorer as a stage, --scorer "
                             "STAGE=DIR (e.g. --scorer sl=runs/sl)")
    if not [p for p in policies if p not in REFERENCES]:
        raise ForesightError(f"--policies {args.policies!r}: no heuristic to compare the learned stages against")
    stages, dirs = _stage_dirs(args.scorer)
    # the weights measured, by hash, read before any compute (a short name can later point at newer weights)
    sha256 = {f"{s}@B{b}W{w}": scorer_sha256(d) for (s, b, w), d in dirs.items()}
    clash = sorted(set(stages) & {*policies, "golden"})
    if clash:
        raise ForesightError(f"--scorer: a stage may not be named like a policy ({', '.join(clash)})")
    for b, w, _ in args.setting:  # W >= B failed only in the first replay, after the model load
        cache_config_arg(b, w, flags=f"--setting {b}:{w}")
    kwargs = parse_policy_args(args.policy_arg, [*stages, *policies])
    given = next((s for s in stages if "scorer" in kwargs[s]), None)
    if given:  # passed beside the stage's own scorer: a TypeError traceback
        raise ForesightError(f"--policy-arg {given}.scorer: a stage's scorer comes from --scorer {given}=DIR only; "
                             "drop the --policy-arg")
    caches = [(b, w) for b, w, _ in args.setting]
    for name in policies:  # unknown names, bad hyperparameters, a cache it cannot run: before any compute
        checked_policy(name, caches, f"policy {name!r}", **kwargs[name])
    for name in stages:
        checked_policy("learned", [], f"policy {name!r}", scorer=dirs[next(k for k in dirs if k[0] == name)],
                       **kwargs[name])
    for stage in stages:
        for b, w, _ in args.setting:
            if (stage, b, w) not in dirs:
                raise ForesightError(f"--scorer: stage {stage!r} has no scorer for B={b} W={w}")
    _check_finished_out(out, {"model": args.model, "traces": args.traces, "scorer_sha256": sha256,
                              "policies": policies, "policy_args": {k: v for k, v in kwargs.items() if v}},
                        sorted(settings_bw))
    traces = load_traces(args.traces)
    if args.heldout_ids:
        keep = {line.strip() for line in read_text(args.heldout_ids, "--heldout-ids file").splitlines()
                if line.strip()}
        traces = traces.filter(lambda r: r["problem_id"] in keep, keep_in_memory=True)  # nothing written there
    if args.max_traces:
        traces = traces.select(range(min(args.max_traces, len(traces))))
    if len(traces) == 0:
        raise ForesightError(f"no held-out traces in {args.traces}")
    labels_for = {}  # read once, here: a missing or wrong label dir failed only after the model load
    for b, w, golden in args.setting:
        try:
            labels_for[b, w] = golden_factory(golden, w)
            labels_for[b, w](b)
        except ForesightError as exc:
            raise ForesightError(f"--setting {b}:{w}: {exc}") from None
    rank, world = rank_world()  # a launcher's environment: this rank replays its share of the batches
    model, _ = load_model(args.model)
    seqs, ids = list(traces["input_ids"]), list(traces["trace_id"])
    # every setting's golden labels and scorers are checked against this model and these traces before any replay
    # (a bad second setting would otherwise be found only after the first setting's)
    settings = []
    for b, w, _ in args.setting:
        base = make_factory(model=model, golden=labels_for[b, w], interval=w, policy_kwargs=kwargs)
        base("golden", b).check_traces(ids, [list(map(int, s)) for s in seqs], model_fingerprint(model))
        learned = {stage: make_policy("learned", scorer=dirs[(stage, b, w)], **kwargs[stage]) for stage in stages}
        for policy in learned.values():
            policy.model.check_compatible(model)
        settings.append((b, w, base, learned))

    summaries, raw, started = [], [], time.time()
    journals = {(b, w): out / f"partial_B{b}_W{w}.jsonl" for b, w, _ in args.setting}  # a killed run resumes
    resumed = any(journal_files(j) for j in journals.values())
    for b, w, base, learned in settings:

        def factory(name, budget, base=base, learned=learned):
            return learned[name] if name in learned else base(name, budget)

        records = evaluate_fidelity(model, seqs, ["golden", *stages, *policies], [b], w, trace_ids=ids,
                                    policy_factory=factory, batch_size=args.batch_size, progress=True,
                                    journal=journals[(b, w)], rank=rank, world_size=world)
        if world == 1:
            summaries.append(quality_summary(records, stages, seed=args.seed))
            raw.extend(records)
    if world > 1:  # the results are written once, by a run in one process that finds every rank's batches
        print(rank_done_note(rank, world, out))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": args.model, "traces": args.traces,
            "scorers": {f"{s}@B{b}W{w}": d for (s, b, w), d in dirs.items()},
            "scorer_sha256": sha256,
            "policies": policies, "policy_args": {k: v for k, v in kwargs.items() if v},
            "seconds": round(time.time() - started, 1), "resumed": resumed}
    (out / "quality.json").write_text(json.dumps({"meta": meta, "summaries": summaries, "records": raw}, indent=1))
    (out / "quality.md").write_text(f"# Quality benchmark ({args.model})\n\n" + quality_markdown(summaries))
    _plot(summaries, out / "quality.png")
    for j in journals.values():
        remove_journal(j)
    print(quality_markdown(summaries))
    print(f"wrote {out}/quality.json, quality.md, quality.png in {meta['seconds']} s")
    return 0


if __name__ == "__main__":
    run_script(main, "quality")
