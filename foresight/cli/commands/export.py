"""``foresight export``: a shareable scorer checkpoint (config, weights, model card) and optional ONNX."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("export", help="export a trained scorer: config.json, model.safetensors, README, ONNX")
    p.add_argument("src", metavar="DIR", help="scorer directory or `foresight train` output directory")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--onnx", action="store_true", help="also write scorer.onnx, verified with onnxruntime")
    p.add_argument("--fidelity", default=None, help="fidelity.json (or its directory) to quote in the model card")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing, non-empty --out directory as a whole (refused otherwise)")
    p.set_defaults(func=run)


def run(args) -> int:
    from evaluation.export import export_scorer

    res = export_scorer(args.src, args.out, onnx=args.onnx, fidelity=args.fidelity, overwrite=args.overwrite)
    print(f"exported {res['scorer_dir']} -> {res['out']} (config.json, model.safetensors, README.md)")
    if res["fidelity_source"]:
        print(f"model card quotes fidelity results from {res['fidelity_source']}")
    else:
        print("no fidelity results found (pass --fidelity to quote them in the model card)")
    if res["onnx_max_abs_diff"] is not None:
        print(f"ONNX: {res['out']}/scorer.onnx, max |onnxruntime - PyTorch| = {res['onnx_max_abs_diff']:.3e} (<= 1e-5)")
    return 0
