"""The end-to-end demo (``foresight demo`` / ``make demo``): the whole ForesightKV method on a laptop.

Stages, each through the same library code the individual commands use:

1. sample reasoning traces for the project's synthetic math word problems (:mod:`golden.traces`);
2. label them with Golden Eviction at two budgets (:mod:`golden.pipeline`);
3. distil a scorer (:mod:`training.sl`), then refine it with GRPO (:mod:`training.grpo`);
4. evaluate fidelity on the held-out traces for the learned scorer, the oracle and the heuristics
   (:mod:`evaluation.fidelity`);
5. write the table, the plot and a markdown report, and export the scorer (:mod:`evaluation.export`).

Every artifact lands in one output directory. Each stage is resumable: rerunning skips finished work.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import foresight
from evaluation.export import export_scorer
from evaluation.fidelity import evaluate_fidelity
from evaluation.policies import make_factory
from evaluation.report import write_fidelity_outputs
from foresight.data import synthetic_problems
from foresight.fingerprint import file_sha256
from foresight.outputs import OutputKind, check_output, prepare_output_dir
from foresight.scorer import WEIGHTS_NAME
from golden.pipeline import label_traces
from golden.traces import generate_traces, load_traces
from training.grpo import GRPOConfig, run_grpo
from training.sl import run_sl
from training.sl_config import SLConfig

#: The demo's output directory: one sub-directory per stage (each its own job's output) and the report.
DEMO_OUTPUT = OutputKind("demo", ("demo_config.json", "traces", "golden", "sl", "grpo", "fidelity", "scorer_export",
                                  "summary.json", "report.md"), (("demo_config.json",),))

DEMO_POLICIES = ["full", "golden", "learned", "lazy", "h2o", "snapkv", "rkv", "tova", "streaming_llm", "random"]


@dataclass
class DemoConfig:
    """Settings of the demo; ``fast()`` shrinks them for the test suite."""

    model: str = "smollm2-135m"
    out_dir: str = "runs/demo"
    problems: int = 24
    max_new_tokens: int = 320
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    batch_size: int = 8
    budget: int = 128
    budgets: list[int] = field(default_factory=lambda: [64, 128])
    interval: int = 32
    heldout: float = 4  # held-out problems (a count; a fraction in (0, 1) also works)
    sl_steps: int = 150
    sl_lr: float = 1e-2
    grpo_steps: int = 4
    grpo_group: int = 4
    grpo_lr: float = 3e-4
    grpo_temperature: float = 0.01  # Plackett-Luce temperature matched to a hinge-trained scorer's score scale
    export_onnx: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.budget not in self.budgets:
            raise ValueError(f"the training budget {self.budget} must be one of the evaluated budgets {self.budgets}")
        if any(b <= self.interval for b in self.budgets):
            raise ValueError(f"every budget must exceed the interval {self.interval}")
        if self.problems < 4:
            raise ValueError("the demo needs at least 4 problems (train and held-out)")

    @classmethod
    def fast(cls, **overrides) -> "DemoConfig":
        base = dict(problems=8, max_new_tokens=200, budget=64, budgets=[32, 64], interval=16, heldout=0.25,
                    sl_steps=20, grpo_steps=2, grpo_group=2, export_onnx=True)
        base.update(overrides)
        return cls(**base)


def _stage(n: int, title: str) -> float:
    print(f"\n[{n}/5] {title}", flush=True)
    return time.perf_counter()


def _done(t0: float) -> None:
    print(f"      done in {time.perf_counter() - t0:.0f} s", flush=True)


def run_demo(cfg: DemoConfig) -> dict:
    """Run every stage; returns the summary also written to ``<out_dir>/summary.json``."""
    check_output(cfg.out_dir, DEMO_OUTPUT)
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model, tok = foresight.load_model(cfg.model)  # a bad name is refused before anything is written
    out = prepare_output_dir(cfg.out_dir, DEMO_OUTPUT)
    (out / "demo_config.json").write_text(json.dumps(asdict(cfg), indent=2))

    t0 = _stage(1, f"sampling reasoning traces for {cfg.problems} synthetic problems with {cfg.model}")
    problems = synthetic_problems(cfg.problems, seed=cfg.seed)
    traces_dir = generate_traces(model, tok, problems, out / "traces", samples=1, max_new_tokens=cfg.max_new_tokens,
                                 temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seed,
                                 batch_size=cfg.batch_size)
    traces = load_traces(traces_dir)
    lengths = [len(x) for x in traces["input_ids"]]
    print(f"      {len(lengths)} traces, {min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f})")
    _done(t0)

    t0 = _stage(2, f"Golden Eviction labels at B={cfg.budgets}, W={cfg.interval}")
    golden_root = out / "golden"
    for b in cfg.budgets:
        s = label_traces(model, traces_dir, golden_root / f"B{b}_W{cfg.interval}", b, cfg.interval)
        print(f"      B={b}: {s.planned} traces labelled, {s.skipped} shorter than B+W skipped")
    _done(t0)

    t0 = _stage(3, f"distilling the scorer ({cfg.sl_steps} steps), then GRPO ({cfg.grpo_steps} steps, "
                   f"G={cfg.grpo_group})")
    common = dict(model=cfg.model, traces=str(traces_dir), budget=cfg.budget, interval=cfg.interval,
                  heldout=cfg.heldout, split_seed=cfg.seed, seed=cfg.seed, report_to="none")
    sl = run_sl(SLConfig(out_dir=str(out / "sl"), labels=str(golden_root / f"B{cfg.budget}_W{cfg.interval}"),
                         steps=cfg.sl_steps, lr=cfg.sl_lr, checkpoint_every=cfg.sl_steps, log_every=10,
                         eval_fidelity=False, **common), model=model, overwrite=True)  # a rerun trains afresh
    grpo = run_grpo(GRPOConfig(out_dir=str(out / "grpo"), init_scorer=sl["scorer"], steps=cfg.grpo_steps,
                               group_size=cfg.grpo_group, lr=cfg.grpo_lr, temperature=cfg.grpo_temperature,
                               checkpoint_every=cfg.grpo_steps,
                               **common), model=model, overwrite=True)
    _done(t0)

    t0 = _stage(4, f"fidelity on held-out traces: {', '.join(DEMO_POLICIES)} at B={cfg.budgets}")
    split = json.loads((out / "sl" / "split.json").read_text())
    held = set(split["heldout"])
    rows = [i for i, t in enumerate(traces["trace_id"]) if t in held]
    held_ds = traces.select(rows)
    transfer = {"learned": {"any_budget": True}}  # one scorer (trained at cfg.budget) runs at every budget: noted
    factory = make_factory(model=model, scorer=grpo["scorer"], golden=str(golden_root), interval=cfg.interval,
                           policy_kwargs=transfer)
    skipped: list[str] = []
    records = evaluate_fidelity(model, held_ds["input_ids"], DEMO_POLICIES, cfg.budgets, cfg.interval,
                                trace_ids=held_ds["trace_id"], policy_factory=factory, progress=True,
                                on_skip=lambda n, b, why: skipped.append(f"skipped {n} at B={b}: {why}"))
    sl_records = evaluate_fidelity(model, held_ds["input_ids"], ["learned"], cfg.budgets, cfg.interval,
                                   trace_ids=held_ds["trace_id"],
                                   policy_factory=make_factory(model=model, scorer=sl["scorer"],
                                                               policy_kwargs=transfer))
    for r in sl_records:
        r["policy"] = "learned (SL only)"
    records += sl_records
    _done(t0)

    t0 = _stage(5, "report, plot and scorer export")
    notes = [f"model `{cfg.model}`, {len(rows)} held-out traces (of {len(lengths)}), synthetic math word problems",
             f"`learned` = SL ({cfg.sl_steps} steps) + GRPO ({cfg.grpo_steps} steps) scorer trained at "
             f"B={cfg.budget}, W={cfg.interval}; `learned (SL only)` = before GRPO", *skipped]
    md = write_fidelity_outputs(records, out / "fidelity", notes=notes, title="ForesightKV demo: fidelity")
    # the card quotes the exported (GRPO) scorer's rows, named by its weights, and the heuristics beside them
    sha = file_sha256(Path(grpo["scorer"]) / WEIGHTS_NAME)
    card = [{**r, "scorer_sha256": sha} if r["policy"] == "learned" else r for r in records
            if r["policy"] != "learned (SL only)"]
    (out / "fidelity" / "card_fidelity.json").write_text(json.dumps(card, indent=2) + "\n")
    exported = export_scorer(grpo["scorer"], out / "scorer_export", onnx=cfg.export_onnx,
                             fidelity=out / "fidelity" / "card_fidelity.json", overwrite=True)  # a rerun re-exports
    grpo_brief = _brief(grpo)
    verdict = summarise(records, cfg.budgets)
    line = grpo_verdict(grpo_brief)
    if line:
        verdict.append(line)
    summary = {"out_dir": str(out), "minutes": round((time.perf_counter() - t_start) / 60, 2),
               "traces": len(lengths), "heldout_traces": len(rows), "sl": _brief(sl), "grpo": grpo_brief,
               "export": exported, "verdict": verdict}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    report = [md, "", "## Verdict", "", *[f"- {v}" for v in verdict], "",
              f"Plot: `fidelity/fidelity.png`. Scorer: `scorer_export/`. Total time {summary['minutes']} min."]
    (out / "report.md").write_text("\n".join(report) + "\n")
    _done(t0)
    print("\n" + md)
    print("Verdict:")
    for v in verdict:
        print(f"  - {v}")
    print(f"\nAll artifacts in {out}/ (report.md, fidelity/, scorer_export/, traces/, golden/, sl/, grpo/); "
          f"{summary['minutes']} min in total.")
    return summary


def _brief(summary: dict) -> dict:
    keep = ("scorer", "steps", "skipped_steps", "final", "eval_before", "heldout")
    brief = {k: summary[k] for k in keep if k in summary}
    if "eval" in summary:
        brief["eval_after"] = summary["eval"]
    return brief


def grpo_verdict(grpo: dict) -> str | None:
    """One line: GRPO's held-out reward and loss ratio before -> after (its own evaluation, training budget)."""
    before, after = grpo.get("eval_before") or {}, grpo.get("eval_after") or {}
    keys = ("heldout_reward_sample", "heldout_reward_topk", "heldout_loss_ratio_topk")
    if not all(k in before and k in after for k in keys):
        return None
    b, a = (tuple(d[k] for k in keys) for d in (before, after))
    better = a[0] > b[0] and a[2] <= b[2]
    return (f"GRPO ({grpo.get('steps', '?')} steps) on {after.get('heldout_traces', '?')} held-out traces: sampled "
            f"reward {b[0]:.5f} -> {a[0]:.5f}, top-k reward {b[1]:.5f} -> {a[1]:.5f}, top-k loss ratio {b[2]:.4f} "
            f"-> {a[2]:.4f} ({'improved' if better else 'no clear improvement'}; a short run on few traces)")


def summarise(records: list[dict], budgets: list[int]) -> list[str]:
    """One honest sentence per budget: where the learned scorer stands against golden and the heuristics."""
    heuristics = {"lazy", "h2o", "snapkv", "rkv", "tova", "streaming_llm", "random"}
    lines = []
    for b in budgets:
        at = {r["policy"]: r["loss_ratio"] for r in records if r["budget"] == b and not math.isnan(r["loss_ratio"])}
        if "learned" not in at:
            lines.append(f"B={b}: the learned scorer was not evaluated")
            continue
        heur = {k: v for k, v in at.items() if k in heuristics}
        best_name = min(heur, key=heur.get) if heur else None
        parts = [f"B={b}: learned loss ratio {at['learned']:.3f}"]
        if "learned (SL only)" in at:
            parts.append(f"SL-only {at['learned (SL only)']:.3f}")
        if "golden" in at:
            parts.append(f"golden {at['golden']:.3f}")
        if best_name:
            rel = "beats" if at["learned"] < heur[best_name] else "does not beat"
            rank = 1 + sum(v < at["learned"] for v in heur.values())
            parts.append(f"best heuristic {best_name} {heur[best_name]:.3f} -> learned {rel} it "
                         f"(rank {rank} of {len(heur) + 1} among heuristics + learned)")
        lines.append(", ".join(parts))
    return lines
