"""Session 47 diagnostic: why top-k breaks on traces longer than the training ones (session 46).

On the N longest 1,024-cap validation traces (runs/quality/val1024_traces) at B=64/W=16, replays golden, the recipe's
round 3 (benchmarks/results/quality_B64_prekey_dagger/scorer) top-k and sampled at T=0.005, and both again with every
standardised feature clipped to [-3, 3] before scoring (an intervention through the policy's ``on_features`` hook,
for this diagnostic only), and prints per trace the loss ratio over the scored positions (>= B+W) and, over the events
past position 900, the share of cached entries older than 400 tokens (every layer and KV head). Golden's events are
read through a FeatureRecorder with the scorer's extractor (the features are unused).

    .venv/bin/python benchmarks/results/long_s47/stale.py --traces 4
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from foresight.errors import OneLineParser
from foresight.models import load_model
from foresight.policies.learned import LearnedPolicy
from foresight.policies.recorder import FeatureRecorder
from foresight.runtime import full_forward_ce, replay
from foresight.scorer import Scorer
from golden.policy import GoldenPolicy
from golden.traces import load_traces

R3 = "benchmarks/results/quality_B64_prekey_dagger/scorer"
LABELS = "runs/quality/golden_val1024_B64_W16"
B, W, LATE, OLD = 64, 16, 900, 400


def main() -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=int, default=4, help="the N longest traces")
    p.add_argument("--clip", type=float, default=3.0, help="the standardised range of the clipped runs")
    args = p.parse_args()
    if args.traces < 1 or not args.clip > 0:
        p.error(f"--traces must be >= 1 and --clip > 0, got {args.traces} and {args.clip}")
    for need in ("runs/quality/val1024_traces/plan.json", f"{LABELS}/plan.json", f"{R3}/config.json"):
        if not Path(need).is_file():
            p.error(f"{need} missing (run benchmarks/results/long_s46/run.sh and long_s47/run.sh first)")
    torch.manual_seed(0)
    model, _ = load_model("smollm2-135m")
    rows = sorted(load_traces("runs/quality/val1024_traces"), key=lambda r: -len(r["input_ids"]))[: args.traces]
    scorer = Scorer.from_pretrained(R3)
    mu, sd = scorer.feature_mean, scorer.feature_std

    def hooks(clip: bool):
        ages: list[float] = []

        def on_event(view, feats):
            if clip:  # in place, so the scorer reads the clipped features
                m, s = mu[view.layer_idx][None, :, None, :], sd[view.layer_idx][None, :, None, :]
                feats.copy_(torch.maximum(torch.minimum(feats, m + args.clip * s), m - args.clip * s))
            t = int(view.positions.max()) + 1
            if t > LATE:
                ok = view.valid[0]
                ages.append(((t - view.positions[0])[ok] > OLD).float().mean().item())
        return ages, on_event

    print(f"| trace | tokens | policy | loss ratio | share of cached entries older than {OLD} after position {LATE} |")
    print("|---|---:|---|---:|---:|")
    for r in rows:
        ids = torch.tensor([list(r["input_ids"])])
        full = full_forward_ce(model, ids)[0]
        scored = slice(B + W, ids.shape[1] - 1)
        for name, kind, kw, clip in [
            ("golden", "golden", {}, False),
            ("top-k", "learned", dict(selection="topk"), False),
            (f"top-k, clip {args.clip:g}", "learned", dict(selection="topk"), True),
            ("sampled T=0.005", "learned", dict(selection="sample", temperature=0.005), False),
            (f"sampled, clip {args.clip:g}", "learned", dict(selection="sample", temperature=0.005), True),
        ]:
            ages, hook = hooks(clip)
            if kind == "golden":
                policy = FeatureRecorder(extractor=scorer.config.extractor(), driver=GoldenPolicy(labels=LABELS),
                                         on_event=hook)
            else:
                policy = LearnedPolicy(scorer=R3, on_features=hook, **kw)
            ce = replay(model, ids, policy, budget=B, interval=W, trace_ids=[r["trace_id"]]).ce[0]
            ratio = ce[scored].sum().item() / full[scored].sum().item()
            print(f"| {r['trace_id']} | {ids.shape[1]} | {name} | {ratio:.4f} | {np.mean(ages):.3f} |", flush=True)


if __name__ == "__main__":
    main()
