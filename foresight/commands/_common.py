"""Arguments shared by several subcommands; their argparse types (:mod:`foresight.config`) refuse bad values as
one-line usage errors (exit status 2) before anything is loaded or written."""

from __future__ import annotations

import argparse
import json

from foresight.config import device_arg, nonnegative_int, parse_overrides, positive_int, read_yaml_mapping


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="built-in name, local dir, .gguf file or HF id")
    p.add_argument("--device", type=device_arg, default=None,
                   help="cuda, cpu, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="weights dtype (default: bf16 on GPU, fp32 on CPU)")


def add_cache_args(p: argparse.ArgumentParser, budget_default: int | None = 128, interval_default: int | None = 32):
    p.add_argument("--budget", type=positive_int, default=budget_default, help="B: entries kept per (layer, KV head)")
    p.add_argument("--interval", type=positive_int, default=interval_default, help="W: new tokens between evictions")
    p.add_argument("--sinks", type=nonnegative_int, default=0, help="never evict the first S positions")


def add_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="full", help="policy name (see `foresight policies`)")
    p.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="policy hyperparameter (repeatable), e.g. --policy-arg alpha=2e-4",
    )
    p.add_argument("--policy-config", default=None, help="YAML file of policy hyperparameters")


parse_kv = parse_overrides  # ``key=value`` strings, values read as YAML scalars


def policy_kwargs(args) -> dict:
    """``--policy-config`` (a YAML mapping) updated by ``--policy-arg KEY=VALUE``."""
    kwargs = {}
    if getattr(args, "policy_config", None):
        kwargs.update(read_yaml_mapping(args.policy_config, "--policy-config file"))
    kwargs.update(parse_kv(getattr(args, "policy_arg", []) or []))
    return kwargs


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))
