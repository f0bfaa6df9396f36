"""Paired per-trace comparison of scorers on the GRPO held-out traces: sampled reward (G rollouts, several noise
seeds, same seeds for every scorer), sampled loss ratio, top-k reward and top-k loss ratio.

Usage: python benchmarks/grpo_smollm2/compare.py NAME[,NAME..] SCORER_DIR[,DIR..] [--exp DIR]   (writes
DIR/compare.json; --exp defaults to $E, else runs/exp7)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from foresight.config import check_output_file, named_dirs
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.fingerprint import check_same_model
from foresight.scorer import Scorer
from golden.traces import load_traces
from training.distributed import DistInfo
from training.grpo import GRPOConfig, GRPOTask, _derive_seed
from training.reward import loss_ratio

SEEDS = [12345, 777]


def exp_dir(text: str) -> Path:
    """The run.sh output directory (``--exp``), which must exist."""
    if not Path(text).is_dir():
        raise ForesightError(f"--exp {text}: not a directory (the output of benchmarks/grpo_smollm2/run.sh; "
                             "default $E, else runs/exp7)")
    return Path(text)


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", help="scorer names, comma-separated (e.g. sl,grpo60)")
    p.add_argument("dirs", help="their scorer directories, comma-separated, in the same order")
    p.add_argument("--exp", default=os.environ.get("E", "runs/exp7"), help="run.sh output directory (default $E)")
    args = p.parse_args(argv)
    exp = exp_dir(args.exp)
    scorers = named_dirs(args.names, args.dirs)
    out = check_output_file(exp / "compare.json", "output")
    # every scorer is replayed at the first one's B and W, on its model: checked before the model loads
    first = Scorer.from_pretrained(scorers[0][1]).config
    for name, d in scorers[1:]:
        cfg = Scorer.from_pretrained(d).config
        check_same_model(cfg.fingerprint, first.fingerprint, f"scorer {name} ({d})",
                         fix=f"compare scorers of the model of {scorers[0][1]}")
        if (cfg.budget, cfg.interval) != (first.budget, first.interval):
            raise ForesightError(f"scorer {name} ({d}) was trained at B={cfg.budget} W={cfg.interval}, "
                                 f"{scorers[0][0]} at B={first.budget} W={first.interval}: compare one setting")
    load_traces(exp / "traces")  # a missing trace directory is named before the model loads
    cfg = GRPOConfig(traces=str(exp / "traces"), init_scorer=scorers[0][1], heldout=12, group_size=8,
                     temperature=0.003, out_dir="/tmp/cmp")
    task = GRPOTask(cfg, DistInfo(rank=0, world_size=1, local_rank=0, device="cpu"))
    start = task.budget + task.interval
    rows = []
    for name, d in scorers:
        sc = Scorer.from_pretrained(d, model=task.model).eval()
        for row in task.val_rows:
            ce_full = task.full_reference(row)[0]
            rec = {"scorer": name, "trace": row["trace_id"]}
            for s in SEEDS:
                ro = task.rollout(row, _derive_seed(s, row["trace_id"]), 8, scorer=sc)
                a, b = loss_ratio(ro.ce, ce_full, start)
                rec[f"r_sample_{s}"] = float(ro.rewards.mean())
                rec[f"lr_sample_{s}"] = a / b
            rec["r_topk"], rec["ce_topk"], rec["ce_full"] = task.topk_episode(row, scorer=sc)
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main, "compare")
