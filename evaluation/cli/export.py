"""``foresight export``: a shareable scorer checkpoint (config, weights, model card), optional ONNX and adapter."""

from __future__ import annotations

from foresight.errors import ForesightError


def register(sub) -> None:
    p = sub.add_parser("export", help="export a trained scorer: config.json, model.safetensors, README, ONNX")
    p.add_argument("src", metavar="DIR", help="scorer directory or `foresight train` output directory")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--onnx", action="store_true", help="also write scorer.onnx, verified with onnxruntime")
    p.add_argument("--fidelity", default=None, help="fidelity.json (or its directory) to quote in the model card")
    p.add_argument("--adapter", default=None, metavar="DIR",
                   help="also export this peft adapter (a `foresight train adapt` output or adapter dir) to OUT/adapter")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="record T as the scorer's selection=sample temperature (a scorer trained without one)")
    p.add_argument("--spread", type=float, default=None, metavar="S",
                   help="record S as the scorer's selection=topk spread (chosen on validation traces)")
    p.add_argument("--newcomer-bonus", type=float, default=None, metavar="B",
                   help="record B as the scorer's selection=topk newcomer bonus (chosen on validation traces)")
    p.add_argument("--age-prior", type=float, default=None, metavar="L",
                   help="record L as the scorer's selection=topk age prior (chosen on long validation traces)")
    p.add_argument("--selection", default=None, metavar="topk|sample",
                   help="record the learned policy's default selection for this scorer (sample needs a temperature)")
    p.add_argument("--budget", type=int, default=None, metavar="B",
                   help="with --interval: record the (B, W) of the cache the scorer runs in, when it is not the one it "
                        "was trained at (a transfer measured first); its recent-query window stays its trained W")
    p.add_argument("--interval", type=int, default=None, metavar="W", help="see --budget")
    p.add_argument("--base-model", default=None, metavar="HUB_ID",
                   help="the Hub id of the language model the scorer serves, for the card's metadata (default: known "
                        "from the fingerprint when it names a built-in model or a Hub id)")
    p.add_argument("--note", action="append", default=[], metavar="KEY=TEXT",
                   help="add KEY: TEXT to the exported provenance and model card (repeatable)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in --out as a whole (only a directory `foresight export` wrote; "
                        "see docs/reliability.md)")
    p.set_defaults(func=run)


def _notes(items: list[str]) -> dict[str, str]:
    """``KEY=TEXT`` arguments as a dict; refuses one without ``=`` and a key given twice."""
    notes: dict[str, str] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq:
            raise ForesightError(f"--note {item}: expected KEY=TEXT")
        if key in notes:
            raise ForesightError(f"--note {key}: given twice")
        notes[key] = text
    return notes


def run(args) -> int:
    from evaluation.export import export_scorer

    res = export_scorer(args.src, args.out, onnx=args.onnx, fidelity=args.fidelity, overwrite=args.overwrite,
                        adapter=args.adapter, temperature=args.temperature, spread=args.spread,
                        newcomer_bonus=args.newcomer_bonus, age_prior=args.age_prior, selection=args.selection,
                        notes=_notes(args.note), budget=args.budget, interval=args.interval,
                        base_model=args.base_model)
    print(f"exported {res['scorer_dir']} -> {res['out']} (config.json, model.safetensors, README.md)")
    if res["adapter"]:
        a = res["adapter"]
        trained = (f"trained under {a['policy']} at B={a['budget']} W={a['interval']}" if a["policy"]
                   else "no training record")
        print(f"adapter -> {res['out']}/adapter (peft format, {trained}; "
              + ("the scorer's fingerprint now records it)" if a["paired"] else "not trained with this scorer)"))
    if res["fidelity_source"]:
        print(f"model card quotes fidelity results from {res['fidelity_source']}")
    else:
        print("no fidelity results found (pass --fidelity to quote them in the model card)")
    if res["onnx_max_abs_diff"] is not None:
        print(f"ONNX: {res['out']}/scorer.onnx, max |onnxruntime - PyTorch| = {res['onnx_max_abs_diff']:.3e} (<= 1e-5)")
    return 0
