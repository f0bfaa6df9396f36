"""Probe: reward spread and how far sampled evictions stray from top-k, per Plackett-Luce temperature."""
import os, sys, time
import torch
from training.distributed import DistInfo
from training.grpo import GRPOConfig, GRPOTask

E = os.environ.get("E", "runs/exp7")
cfg = GRPOConfig(traces=f"{E}/traces", init_scorer=f"{E}/sl/scorer", heldout=12, group_size=8, out_dir="/tmp/probe")
task = GRPOTask(cfg, DistInfo(rank=0, world_size=1, local_rank=0, device="cpu"))
task.module.eval()
rows = task.train_rows[:: max(1, len(task.train_rows) // 4)][:4]
for T in [float(t) for t in sys.argv[1:]]:
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
        out.append((float(ro.rewards.mean()), float(ro.rewards.std()), r_top, swap, time.time() - t0, len(row["input_ids"])))
        print(f"T={T} {row['trace_id'][:30]:30s} N={out[-1][5]} sample {out[-1][0]:.4f}±{out[-1][1]:.4f} topk {r_top:.4f} swap {swap:.3f} ({out[-1][4]:.1f}s)", flush=True)
    m = lambda i: sum(o[i] for o in out) / len(out)
    print(f"== T={T}: sample {m(0):.4f} std {m(1):.4f} topk {m(2):.4f} swap {m(3):.3f}", flush=True)
