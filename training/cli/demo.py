"""``foresight demo``: the end-to-end pipeline that ``make demo`` runs (see :mod:`training.demo`)."""

from __future__ import annotations

from foresight.config import positive_int


def register(sub) -> None:
    p = sub.add_parser("demo", help="end-to-end demo: traces, golden labels, SL + GRPO, fidelity, report, export")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default="runs/demo", help="output directory for every artifact")
    p.add_argument("--fast", action="store_true", help="a much smaller run (used by the test suite)")
    p.add_argument("--problems", type=positive_int, default=None, help="number of synthetic problems")
    p.add_argument("--sl-steps", type=positive_int, default=None)
    p.add_argument("--grpo-steps", type=positive_int, default=None)
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX export")
    p.set_defaults(func=run)


def run(args) -> int:
    from training.demo import DemoConfig, run_demo

    overrides = {"model": args.model, "out_dir": args.out}
    for key in ("problems", "sl_steps", "grpo_steps"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.no_onnx:
        overrides["export_onnx"] = False
    cfg = DemoConfig.fast(**overrides) if args.fast else DemoConfig(**overrides)
    run_demo(cfg)
    return 0
