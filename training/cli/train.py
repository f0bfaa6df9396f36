"""``foresight train <trainer> --config FILE [key=value ...] [--resume]``: train the learned scorer.

Trainers (``sl`` distillation, ``grpo``, ``adapt``, ``e2e``) come from :mod:`training.registry`, so this module never
changes when a trainer is added. Launch it plain, under ``foresight launch --nproc-per-node N``, ``torchrun
--nproc_per_node N -m foresight`` or ``deepspeed --num_gpus N --module foresight`` (see docs/gpu.md).
"""

from __future__ import annotations

import json

from foresight.cli.args import parse_kv
from foresight.config import read_yaml_mapping
from training.registry import TRAINERS


def register(sub) -> None:
    p = sub.add_parser("train", help="train the learned scorer (sl, grpo, adapt, e2e)")
    tsub = p.add_subparsers(dest="trainer", metavar="TRAINER")
    for name, spec in sorted(TRAINERS.items()):
        tp = tsub.add_parser(name, help=spec.help, description=spec.help)
        tp.add_argument("--config", default=None, help=f"YAML config (e.g. configs/{name}.yaml)")
        tp.add_argument("--resume", action="store_true", help="continue from the last checkpoint in out_dir")
        tp.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run of this trainer in out_dir (refused otherwise)")
        tp.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="override config keys")
        tp.set_defaults(func=run)
    p.set_defaults(func=lambda args: p.print_help() or 0)


def build_config(spec, config_path: str | None, overrides: list[str]):
    """Config dataclass from a YAML file plus ``key=value`` overrides (given before or after ``--config``).

    The dataclass checks every key and value on construction (unknown keys, wrong types, bad ranges, a
    missing DeepSpeed config or device), so a bad config fails here, before any model or data is loaded."""
    data = read_yaml_mapping(config_path, "config file") if config_path else {}
    data.update(parse_kv(overrides))
    return spec.config_cls.from_dict(data)


def run(args) -> int:
    from training.distributed import shutdown_distributed

    spec = TRAINERS[args.trainer]
    cfg = build_config(spec, args.config, args.overrides)
    summary = spec.run(cfg, resume=args.resume, overwrite=args.overwrite)
    shutdown_distributed()  # on success only: after a rank's error the others would wait at its barrier
    if summary is not None and summary.get("eval"):
        print(json.dumps(summary["eval"], indent=2, default=str))
    return 0
