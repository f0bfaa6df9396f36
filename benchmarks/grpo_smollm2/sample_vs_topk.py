"""Fidelity of the `learned` policy at inference, top-k vs `selection=sample` (2W pool), on the held-out traces.

Usage: python benchmarks/grpo_smollm2/sample_vs_topk.py NAME[,NAME..] SCORER_DIR[,DIR..]   (env: E, T)
"""
import json, os, sys
from evaluation.fidelity import evaluate_fidelity
from foresight import load_model
from foresight.policies import make_policy
from golden.traces import load_traces

E = os.environ.get("E", "runs/exp7")
T = float(os.environ.get("T", "0.003"))
model, _ = load_model("smollm2-135m")
held = set(json.load(open(f"{E}/sl/split.json"))["heldout"])
ds = load_traces(f"{E}/traces")
ds = ds.select([i for i, t in enumerate(ds["trace_id"]) if t in held])
pols = {}
for name, d in zip(sys.argv[1].split(","), sys.argv[2].split(",")):
    pols[f"{name} top-k"] = dict(scorer=d)
    for seed in (0, 1):
        pols[f"{name} sample T={T} seed {seed}"] = dict(scorer=d, selection="sample", temperature=T, seed=seed)
recs = evaluate_fidelity(model, ds["input_ids"], list(pols), [64], 16, trace_ids=ds["trace_id"], progress=True,
                         policy_factory=lambda n, b: make_policy("learned", **pols[n]))
for r in recs:
    print(f"{r['policy']:32s} loss ratio {r['loss_ratio']:.4f}  top-1 {r['top1_agreement']:.3f}", flush=True)
json.dump(recs, open(f"{E}/sample_vs_topk.json", "w"), indent=1, default=str)
