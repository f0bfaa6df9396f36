"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse
import json

import yaml


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="built-in name, local dir, .gguf file or HF id")
    p.add_argument("--device", default=None, help="cuda, cpu, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU)")


def add_cache_args(p: argparse.ArgumentParser, budget_default: int | None = 128, interval_default: int | None = 32):
    p.add_argument("--budget", type=int, default=budget_default, help="B: entries kept per (layer, KV head)")
    p.add_argument("--interval", type=int, default=interval_default, help="W: new tokens between evictions")
    p.add_argument("--sinks", type=int, default=0, help="never evict the first S positions")


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


def parse_kv(items: list[str]) -> dict:
    """Parse ``key=value`` strings, values read as YAML scalars (numbers, booleans, strings)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str):  # YAML 1.1 reads "2e-4" (no dot) as a string
            try:
                parsed = float(parsed)
            except ValueError:
                pass
        out[key.strip()] = parsed
    return out


def policy_kwargs(args) -> dict:
    kwargs = {}
    if getattr(args, "policy_config", None):
        with open(args.policy_config) as f:
            kwargs.update(yaml.safe_load(f) or {})
    kwargs.update(parse_kv(getattr(args, "policy_arg", []) or []))
    return kwargs


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))
