"""Fidelity of the `learned` policy at inference, top-k vs `selection=sample` (2W pool), on the held-out traces.

Usage: python benchmarks/grpo_smollm2/sample_vs_topk.py NAME[,NAME..] SCORER_DIR[,DIR..] [--exp DIR]
[--temperature T]   (reads DIR/traces and DIR/sl/split.json, writes DIR/sample_vs_topk.json; --exp defaults to
$E, else runs/exp7, --temperature to $T, else 0.003)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from evaluation.fidelity import evaluate_fidelity
from foresight import load_model
from foresight.config import check_output_file, named_dirs, positive_float, positive_int, read_json
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.policies import make_policy
from foresight.policies.base import require_cache
from golden.traces import load_traces


def heldout_traces(exp: str):
    """The traces of ``exp/traces`` that the SL run held out (``exp/sl/split.json``); every one must be there."""
    split = Path(exp) / "sl" / "split.json"
    held = read_json(split, "split file").get("heldout")
    if not isinstance(held, list) or not held or not all(isinstance(t, str) for t in held):
        raise ForesightError(f"{split}: `heldout` must be a non-empty list of trace ids")
    ds = load_traces(Path(exp) / "traces")
    keep = [i for i, t in enumerate(ds["trace_id"]) if t in set(held)]
    missing = sorted(set(held) - set(ds["trace_id"]))
    if missing:  # fewer traces than the split names: numbers on another set than the SL run's held-out one
        raise ForesightError(f"{split}: {len(missing)} held-out trace(s) are not in {Path(exp) / 'traces'} (e.g. "
                             f"{missing[0]!r}); use the traces the SL run split")
    return ds.select(keep)


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", help="scorer names, comma-separated (e.g. sl,grpo60)")
    p.add_argument("dirs", help="their scorer directories, comma-separated, in the same order")
    p.add_argument("--exp", default=os.environ.get("E", "runs/exp7"), help="run.sh output directory (default $E)")
    p.add_argument("--temperature", type=positive_float, default=os.environ.get("T", "0.003"),
                   help="temperature of selection=sample (default $T, else 0.003)")
    p.add_argument("--budget", type=positive_int, default=64)
    p.add_argument("--interval", type=positive_int, default=16)
    args = p.parse_args(argv)
    T = args.temperature
    scorers = named_dirs(args.names, args.dirs)
    out = check_output_file(Path(args.exp) / "sample_vs_topk.json", "output")
    pols = {}
    for name, d in scorers:  # bad scorers and settings fail before the model loads
        pols[f"{name} top-k"] = dict(scorer=d)
        for seed in (0, 1):
            pols[f"{name} sample T={T} seed {seed}"] = dict(scorer=d, selection="sample", temperature=T, seed=seed)
    built = {}
    for label, kwargs in pols.items():
        try:
            built[label] = make_policy("learned", **kwargs)
        except (TypeError, ValueError) as exc:
            raise ForesightError(f"policy {label!r}: {exc}") from None
        require_cache(built[label], args.budget, args.interval)
    ds = heldout_traces(args.exp)
    model, _ = load_model("smollm2-135m")
    recs = evaluate_fidelity(model, ds["input_ids"], list(pols), [args.budget], args.interval,
                             trace_ids=ds["trace_id"], progress=True, policy_factory=lambda n, b: built[n])
    for r in recs:
        print(f"{r['policy']:32s} loss ratio {r['loss_ratio']:.4f}  top-1 {r['top1_agreement']:.3f}", flush=True)
    out.write_text(json.dumps(recs, indent=1, default=str))
    return 0


if __name__ == "__main__":
    run_script(main, "sample_vs_topk")
