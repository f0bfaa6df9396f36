"""Paired per-trace comparison of scorers on the GRPO held-out traces: sampled reward (G rollouts, several noise
seeds, same seeds for every scorer), sampled loss ratio, top-k reward and top-k loss ratio."""
import json, os, sys
from training.distributed import DistInfo
from training.grpo import GRPOConfig, GRPOTask, _derive_seed
from training.reward import loss_ratio
from foresight.scorer import Scorer

E = os.environ.get("E", "runs/exp7")
names = sys.argv[1].split(",")
dirs = sys.argv[2].split(",")
seeds = [12345, 777]
cfg = GRPOConfig(traces=f"{E}/traces", init_scorer=dirs[0], heldout=12, group_size=8, temperature=0.003,
                 out_dir="/tmp/cmp")
task = GRPOTask(cfg, DistInfo(rank=0, world_size=1, local_rank=0, device="cpu"))
start = task.budget + task.interval
rows = []
for name, d in zip(names, dirs):
    sc = Scorer.from_pretrained(d, model=task.model).eval()
    for row in task.val_rows:
        ce_full = task.full_reference(row)[0]
        rec = {"scorer": name, "trace": row["trace_id"]}
        for s in seeds:
            ro = task.rollout(row, _derive_seed(s, row["trace_id"]), 8, scorer=sc)
            a, b = loss_ratio(ro.ce, ce_full, start)
            rec[f"r_sample_{s}"] = float(ro.rewards.mean())
            rec[f"lr_sample_{s}"] = a / b
        rec["r_topk"], rec["ce_topk"], rec["ce_full"] = task.topk_episode(row, scorer=sc)
        rows.append(rec)
        print(json.dumps(rec), flush=True)
json.dump(rows, open(f"{E}/compare.json", "w"), indent=1)
