"""Probe: reward spread and how far sampled evictions stray from top-k, per Plackett-Luce temperature.

Usage: python benchmarks/grpo_smollm2/probe.py T [T ..] [--exp DIR]   (reads DIR/traces and DIR/sl/scorer; --exp
defaults to $E, else runs/exp7)
"""

from __future__ import annotations

import os
import time

import torch

from foresight.config import positive_float
from foresight.errors import OneLineParser, run_script
from foresight.scorer import Scorer
from golden.traces import load_traces
from training.distributed import DistInfo
from training.grpo import GRPOConfig, GRPOTask


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("temperatures", nargs="+", type=positive_float, metavar="T", help="temperatures to probe")
    p.add_argument("--exp", default=os.environ.get("E", "runs/exp7"), help="run.sh output directory (default $E)")
    args = p.parse_args(argv)
    E = args.exp
    Scorer.from_pretrained(f"{E}/sl/scorer")  # both named before the model loads
    load_traces(f"{E}/traces")
    cfg = GRPOConfig(traces=f"{E}/traces", init_scorer=f"{E}/sl/scorer", heldout=12, group_size=8,
                     out_dir="/tmp/probe")
    task = GRPOTask(cfg, DistInfo(rank=0, world_size=1, local_rank=0, device="cpu"))
    task.module.eval()
    rows = task.train_rows[:: max(1, len(task.train_rows) // 4)][:4]
    for T in args.temperatures:
        task.cfg.temperature = T
        out = []
        for row in rows:
            t0 = time.time()
            ro = task.rollout(row, seed=1, group_size=8)
            r_top = task.topk_episode(row)[0]
            with torch.no_grad():
                scores = task.module(ro.features.transpose(0, 1)).transpose(0, 1)  # E L G H C
            s = scores.masked_fill(~ro.free, float("inf"))
            k = ro.order.shape[-1]
            top = torch.zeros_like(ro.free).scatter_(-1, s.topk(k, dim=-1, largest=False).indices, True)
            smp = torch.zeros_like(ro.free).scatter_(-1, ro.order, True)
            swap = 1 - float((top & smp).sum(-1).float().mean()) / k
            out.append((float(ro.rewards.mean()), float(ro.rewards.std()), r_top, swap, time.time() - t0,
                        len(row["input_ids"])))
            print(f"T={T} {row['trace_id'][:30]:30s} N={out[-1][5]} sample {out[-1][0]:.4f}±{out[-1][1]:.4f} "
                  f"topk {r_top:.4f} swap {swap:.3f} ({out[-1][4]:.1f}s)", flush=True)
        m = lambda i: sum(o[i] for o in out) / len(out)  # noqa: E731
        print(f"== T={T}: sample {m(0):.4f} std {m(1):.4f} topk {m(2):.4f} swap {m(3):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    run_script(main, "probe")
