"""Session 48 diagnostic: which attention feature makes top-k keep stale entries on long traces (session 47).

On the N longest 1,024-cap validation traces (runs/quality/val1024_traces) at B=64/W=16, replays the recipe's round 3
(benchmarks/results/quality_B64_prekey_dagger/scorer) with top-k, and again with one feature family held at its
training mean for every candidate (an intervention through the policy's ``on_features`` hook, for this diagnostic
only): the cumulative attention sum, the cumulative and the decayed sums, or the age. Prints per trace the loss ratio
over the scored positions (>= B+W) and, over the events past position 900, the share of cached entries older than 400
tokens (every layer and KV head). Sampled selection at T=0.005 is printed beside for reference.

    .venv/bin/python benchmarks/results/s48/neutral.py --traces 4
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from foresight.errors import OneLineParser
from foresight.feature_groups import ATTN_STATS, feature_columns
from foresight.models import load_model
from foresight.policies.learned import LearnedPolicy
from foresight.runtime import full_forward_ce, replay
from foresight.scorer import Scorer
from golden.traces import load_traces

R3 = "benchmarks/results/quality_B64_prekey_dagger/scorer"
TRACES = "runs/quality/val1024_traces"
B, W, LATE, OLD = 64, 16, 900, 400
CUM, DEC = 6, 7  # positions of the cumulative and decayed sums among a query head's ATTN_STATS


def main() -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=int, default=4, help="the N longest traces")
    args = p.parse_args()
    if args.traces < 1:
        p.error(f"--traces must be >= 1, got {args.traces}")
    for need in (f"{TRACES}/plan.json", f"{R3}/config.json"):
        if not Path(need).is_file():
            p.error(f"{need} missing (run benchmarks/results/long_s46/run.sh first)")
    torch.manual_seed(0)
    model, _ = load_model("smollm2-135m")
    rows = sorted(load_traces(TRACES), key=lambda r: -len(r["input_ids"]))[: args.traces]
    scorer = Scorer.from_pretrained(R3)
    cfg, mu = scorer.config, scorer.feature_mean
    g = model.config.num_attention_heads // model.config.num_key_value_heads
    d = model.config.hidden_size // model.config.num_attention_heads
    attn = feature_columns(("attn",), cfg.feature_set, d, g)
    age = feature_columns(("age",), cfg.feature_set, d, g)
    families = {
        "cum": [attn[h * ATTN_STATS + CUM] for h in range(g)],
        "cum+dec": [attn[h * ATTN_STATS + s] for h in range(g) for s in (CUM, DEC)],
        "age": age,
    }

    def hooks(cols):
        shares: list[float] = []

        def on_event(view, feats):
            if cols:  # in place, so the scorer reads the held features
                feats[..., cols] = mu[view.layer_idx][None, :, None, cols].to(feats.dtype)
            t = int(view.positions.max()) + 1
            if t > LATE:
                ok = view.valid[0]
                shares.append(((t - view.positions[0])[ok] > OLD).float().mean().item())
        return shares, on_event

    print(f"| trace | tokens | policy | loss ratio | share of cached entries older than {OLD} after position {LATE} |")
    print("|---|---:|---|---:|---:|")
    runs = [("top-k", dict(selection="topk"), [])]
    runs += [(f"top-k, {k} at its mean", dict(selection="topk"), c) for k, c in families.items()]
    runs += [("sampled T=0.005", dict(selection="sample", temperature=0.005), [])]
    for r in rows:
        ids = torch.tensor([list(r["input_ids"])])
        full = full_forward_ce(model, ids)[0]
        scored = slice(B + W, ids.shape[1] - 1)
        for name, kw, cols in runs:
            shares, hook = hooks(cols)
            policy = LearnedPolicy(scorer=scorer, on_features=hook, **kw)
            ce = replay(model, ids, policy, budget=B, interval=W, trace_ids=[r["trace_id"]]).ce[0]
            ratio = ce[scored].sum().item() / full[scored].sum().item()
            print(f"| {r['trace_id']} | {ids.shape[1]} | {name} | {ratio:.4f} | {np.mean(shares):.3f} |", flush=True)


if __name__ == "__main__":
    main()
