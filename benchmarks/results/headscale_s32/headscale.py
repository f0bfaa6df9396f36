"""Session 32: is one sampling temperature wrong for heads whose scores have different scales?

The packaged scorers' keep scores spread 7-10x more in some (layer, KV head) than in others (median std over a
head's candidates at an event: 0.013 to 0.12 at B=64), so one temperature samples near top-k in some heads and
near uniform in others. This measures the alternative: each head's drawable scores divided by their standard
deviation at that event before the Plackett-Luce draw (logits ``-score / (tau * std)``, the same Gumbel-top-k
draw, :func:`foresight.sampling.sample_eviction`), against the scorer's sampled selection at its own temperature,
on the same traces, in the same run, paired by problem; the reference quality.json supplies golden and tova (gap
share) and a stage the baseline must reproduce trace for trace.

    python benchmarks/results/headscale_s32/headscale.py --traces runs/quality/val_traces \
        --scorer benchmarks/results/quality_B64_prekey_dagger/scorer --budget 64 --interval 16 --temperature 0.005 --taus 0.1,0.15,0.2,0.3 \
        --reference runs/quality/tsweep_B64/quality.json:t005 --out runs/s32/headscale_B64.json
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evaluation.fidelity import evaluate_fidelity
from evaluation.quality import problem_of
from evaluation.stats import paired_bootstrap
from foresight.config import read_text
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.models import load_model
from foresight.policies.learned import LearnedPolicy
from foresight.sampling import sample_eviction
from golden.traces import load_traces


class HeadStdPolicy(LearnedPolicy):
    """``learned`` with ``selection=sample`` whose logits are ``-score / (tau * std)``, std over the head's
    drawable candidates at this event (an experiment, not registered)."""

    tau: float = 0.2

    def draw(self, scores, num_keep):
        fin = torch.isfinite(scores)
        x = scores.masked_fill(~fin, 0.0)
        n = fin.sum(-1, keepdim=True).clamp(min=1)
        mean = x.sum(-1, keepdim=True) / n
        std = ((((x - mean) ** 2) * fin).sum(-1, keepdim=True) / n).sqrt().clamp(min=1e-6)
        return sample_eviction(torch.where(fin, scores / std, scores), scores.shape[-1] - num_keep, self.tau,
                               self._gen)


def _reference(spec: str, budget: int, interval: int) -> tuple[dict, str]:
    path, _, stage = spec.rpartition(":")
    if not path or not stage:
        raise ForesightError(f"--reference {spec!r}: expected FILE:STAGE")
    try:
        recs = json.loads(read_text(path, "--reference"))["records"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ForesightError(f"--reference {path}: not a quality.json ({exc})") from None
    by = {r["policy"]: r for r in recs if r.get("budget") == budget and r.get("interval") == interval}
    for need in ("golden", "tova", stage):
        if need not in by:
            raise ForesightError(f"--reference {path}: no {need!r} record at B={budget} W={interval}")
    return by, stage


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", required=True)
    ap.add_argument("--scorer", required=True)
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--interval", type=int, required=True)
    ap.add_argument("--temperature", type=float, required=True, help="the baseline's temperature")
    ap.add_argument("--taus", required=True, help="comma-separated temperatures of the standardised scores")
    ap.add_argument("--reference", required=True, help="quality.json:STAGE of the baseline on these traces")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        taus = [float(t) for t in a.taus.split(",")]
    except ValueError:
        raise ForesightError(f"--taus {a.taus!r}: not comma-separated numbers") from None
    if not all(t > 0 for t in taus + [a.temperature]):
        raise ForesightError("--taus and --temperature must be > 0")
    if Path(a.out).exists():
        raise ForesightError(f"--out {a.out} exists; choose a new file")
    ref, stage = _reference(a.reference, a.budget, a.interval)
    traces = load_traces(a.traces)
    ids = list(traces["trace_id"])
    if set(ref[stage]["per_trace_ratio"]) - set(ids):
        raise ForesightError(f"--reference {a.reference}: measured on traces that {a.traces} does not hold")
    base = LearnedPolicy(scorer=a.scorer, selection="sample", temperature=a.temperature)
    base.name = "base"
    pols = [base]
    for tau in taus:
        p = HeadStdPolicy(scorer=a.scorer, selection="sample")
        p.tau, p.name = tau, f"headstd_{tau:g}"
        pols.append(p)
    torch.set_num_threads(1)
    model, _ = load_model("smollm2-135m")
    recs = evaluate_fidelity(model, list(traces["input_ids"]), pols, [a.budget], a.interval, trace_ids=ids,
                             batch_size=4, progress=True)  # the quality benchmark's batch size: the same draws
    got = {r["policy"]: r for r in recs}
    keep = sorted(got["base"]["per_trace_ratio"])
    drift = max(abs(got["base"]["per_trace_ratio"][i] - ref[stage]["per_trace_ratio"][i]) for i in keep)
    if drift > 1e-9:
        raise ForesightError(f"the baseline does not reproduce {a.reference} (max per-trace difference {drift:.2e})")
    g, best = ref["golden"]["loss_ratio"], ref["tova"]["loss_ratio"]
    rows = []
    for name, r in got.items():
        d = paired_bootstrap([r["per_trace_ratio"][i] for i in keep], [got["base"]["per_trace_ratio"][i] for i in keep],
                             groups=[problem_of(i) for i in keep])
        rows.append({"policy": name, "loss_ratio": r["loss_ratio"], "gap_closed": (best - r["loss_ratio"]) / (best - g),
                     "vs_base": d})
        print(f"{name:14s} pooled {r['loss_ratio']:.4f}  gap closed {rows[-1]['gap_closed']:6.1%}  vs base "
              f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}] (by problem)")
    Path(a.out).write_text(json.dumps({"settings": vars(a), "summary": rows, "records": recs}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main, "headscale")
