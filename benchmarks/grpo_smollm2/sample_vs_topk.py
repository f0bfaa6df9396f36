"""Fidelity of the `learned` policy at inference, top-k vs `selection=sample` (2W pool), on the held-out traces."""
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
out = []
for name, d in zip(sys.argv[1].split(","), sys.argv[2].split(",")):
    pols = {"top-k": make_policy("learned", scorer=d)}
    for seed in (0, 1):
        pols[f"sample T={T} seed {seed}"] = make_policy("learned", scorer=d, selection="sample", temperature=T, seed=seed)
    for label, pol in pols.items():
        rec = evaluate_fidelity(model, ds["input_ids"], [pol], [64], 16, trace_ids=ds["trace_id"])[0]
        rec.update(scorer=name, selection=label)
        out.append(rec)
        print(f"{name:8s} {label:24s} loss ratio {rec['loss_ratio']:.4f}  top-1 {rec['top1_agreement']:.3f}", flush=True)
json.dump(out, open(f"{E}/sample_vs_topk.json", "w"), indent=1, default=str)
