"""Session 40: how often the packaged B=64 scorer evicts an entry together with its cache neighbour, top-k against
sampled (four validation traces; see `spread.sh`). Run from the repository root:

    .venv/bin/python benchmarks/results/momentum_s40/adjacency.py > benchmarks/results/momentum_s40/adjacency.txt
"""

import torch

import foresight
from foresight.models import load_model
from foresight.policies import make_policy
from golden.traces import load_traces

TRACES = ["test/geometry/178.json#3", "test/algebra/1098.json#0", "test/algebra/2157.json#1",
          "test/prealgebra/1044.json#2"]


def main() -> None:
    torch.set_num_threads(1)
    ds = load_traces("runs/quality/val_traces")
    ids = list(ds["trace_id"])
    model, _ = load_model("smollm2-135m")
    for tid in TRACES:
        seq = ds[ids.index(tid)]["input_ids"]
        for sel in ("topk", "sample"):
            pol = make_policy("learned", scorer="smollm2-135m-b64-w16", selection=sel, age_prior=0.0)
            st = {"adj": 0, "pairs": 0, "cut": []}
            plain = pol.select

            def select(scores, num_keep, view, plain=plain, st=st):
                keep = plain(scores, num_keep, view)
                if view.event >= 2:  # past the prompt's compression
                    pos = view.candidate_positions[0]
                    gone = torch.ones_like(pos, dtype=torch.bool).scatter_(-1, keep[0], False)
                    for h in range(pos.shape[0]):
                        ev = pos[h][gone[h]].sort().values
                        st["adj"] += int((ev[1:] - ev[:-1] == 1).sum())
                        st["pairs"] += max(len(ev) - 1, 0)
                        s = scores[0, h].sort(descending=True).values
                        st["cut"].append(float(s[num_keep - 1] - s[num_keep]))
                return keep

            pol.select = select
            foresight.replay(model, [seq], policy=pol, budget=64, interval=16)
            print(f"{tid} {sel}: evicted with a neighbour {st['adj'] / st['pairs']:.3f}, "
                  f"median score margin at the cut {torch.tensor(st['cut']).median():.5f}")


if __name__ == "__main__":
    main()
