"""Arguments shared by several subcommands, each declared once here (model; cache B/W/sinks; policies and
``--policy-arg``, read by :func:`parse_policy_args`); commands of the packages above the library use them too. Their argparse types (:mod:`foresight.config`) refuse bad values as one-line usage errors (exit
status 2) before anything is loaded or written."""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from foresight.config import (ConfigError, adapter_arg, device_arg, nonnegative_int, parse_overrides, parse_scalar,
                              positive_int, read_yaml_mapping, unit_float)
from foresight.errors import ForesightError


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="built-in name, local dir, .gguf file or HF id")
    p.add_argument("--device", type=device_arg, default=None,
                   help="cuda, cpu, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="weights dtype (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--adapter", type=adapter_arg, default=None, metavar="DIR",
                   help="PEFT adapter directory loaded on top of --model and merged (e.g. `foresight train adapt` "
                   "or `foresight export` output); the fingerprint records it")


def add_cache_args(p: argparse.ArgumentParser, *, budget_required: bool = False, interval_required: bool = False,
                   several_budgets: bool = False, sinks: bool = True) -> None:
    """``--budget B``, ``--interval W`` and ``--sinks S``, declared here once for every command that takes them.

    Defaults (those of :class:`foresight.schedule.CacheConfig`): no ``--budget`` keeps the full cache (a policy
    that evicts then asks for one); ``--interval`` defaults to ``B // 4``; ``--sinks`` to 0. A command overrides
    them only where it must, with the reason beside the call: ``budget_required`` / ``interval_required`` make
    them mandatory, ``several_budgets`` takes a comma-separated list of budgets (checked by
    :func:`evaluation.policies.parse_budgets`), ``sinks=False`` leaves ``--sinks`` out.
    """
    p.add_argument("--budget", type=str if several_budgets else positive_int, required=budget_required,
                   default=None, metavar="B[,B...]" if several_budgets else "B",
                   help="entries kept per (layer, KV head)" + (", or several comma-separated: 128,256,512"
                                                                  if several_budgets else "")
                   + ("" if budget_required else " (default: none, the full cache)"))
    p.add_argument("--interval", type=positive_int, required=interval_required, default=None, metavar="W",
                   help="new tokens between evictions" + ("" if interval_required else " (default: B // 4)"))
    if sinks:
        p.add_argument("--sinks", type=nonnegative_int, default=0, metavar="S",
                       help="never evict the first S positions (default: 0)")


def refuse_unused_cache_args(args, policy) -> None:
    """Refuse ``--budget`` / ``--interval`` / ``--sinks`` given with a policy that never evicts (one line, exit 2,
    before the model loads): the full cache would be kept while the results recorded or printed the budget."""
    unused = [f"{flag} {v}" for flag, v in (("--budget", args.budget), ("--interval", args.interval),
                                             ("--sinks", getattr(args, "sinks", 0) or None)) if v is not None]
    if not policy.evicts and unused:
        raise ForesightError(f"{' '.join(unused)}: policy {args.policy!r} never evicts, so the cache settings would "
                             "be ignored; pick an evicting policy with --policy (see `foresight policies`)")


def add_sampling_filter_args(p: argparse.ArgumentParser, *, top_p: float, top_k: int) -> None:
    """``--top-p`` and ``--top-k`` with ``default=None``, so that :func:`fill_sampling_filters` can tell an explicit
    value from the default (``top_p`` / ``top_k``, filled in there)."""
    p.add_argument("--top-p", type=unit_float, default=None, help=f"nucleus sampling (default: {top_p})")
    p.add_argument("--top-k", type=nonnegative_int, default=None, help=f"top-k sampling (default: {top_k}; 0: off)")


def fill_sampling_filters(args, *, top_p: float, top_k: int) -> None:
    """Refuse an explicit ``--top-p`` / ``--top-k`` with ``--temperature 0`` (greedy decoding ignores them, yet they
    would be recorded), then fill in the defaults: a run that passes neither records the same settings as before."""
    if args.temperature == 0:
        given = [f"{flag} {v}" for flag, v in (("--top-p", args.top_p), ("--top-k", args.top_k)) if v is not None]
        if given:
            raise ForesightError(f"{' '.join(given)} only applies when sampling: --temperature 0 decodes greedily "
                                 "(drop it, or pass --temperature T > 0)")
    if args.top_p is None:
        args.top_p = top_p
    if args.top_k is None:
        args.top_k = top_k


def add_policy_args(p: argparse.ArgumentParser, *, several: bool = False) -> None:
    """``--policy NAME`` and ``--policy-config FILE`` (one policy in play), or neither (``several``: the command
    declares its own ``--policies``), and ``--policy-arg`` in the one grammar of
    :func:`parse_policy_args`; :func:`policy_kwargs` reads them back."""
    if not several:
        p.add_argument("--policy", default="full", help="policy name (see `foresight policies`; default: full)")
        p.add_argument("--policy-config", default=None, help="YAML file of policy hyperparameters")
    p.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        metavar="[POLICY.]KEY=VALUE",
        help="policy hyperparameter (repeatable), e.g. --policy-arg random.seed=3; the POLICY. prefix is required "
        "where several policies are in play",
    )


parse_kv = parse_overrides  # ``key=value`` strings (trainer config overrides), values read as YAML scalars


def policy_kwargs(args, policies: list[str] | None = None) -> dict[str, dict]:
    """``{policy: hyperparameters}`` from ``--policy-config`` and ``--policy-arg`` for the policies in play
    (default: the one ``--policy``)."""
    return parse_policy_args(args.policy_arg, policies if policies is not None else [args.policy],
                             getattr(args, "policy_config", None))


def parse_policy_args(items: Sequence[str], policies: Sequence[str], config: str | None = None) -> dict[str, dict]:
    """``--policy-arg`` items (and a ``--policy-config`` file) as ``{policy: {key: value}}``, one entry per policy.

    The grammar, the same for every command: ``[POLICY.]KEY=VALUE``. ``POLICY.`` names one of ``policies`` (the
    policies in play); it may be left out where exactly one is in play (``foresight generate``, ``eval aime``) and
    is required where several are (``eval fidelity``, ``bench``). VALUE is read as a YAML scalar (``2e-4``,
    ``true``, ``runs/sl/scorer``); a later item wins. ``config`` (a YAML mapping of KEY: VALUE, one policy only)
    is read first and the items override it. Errors are one line naming the bad item; the policy itself checks the
    keys and values when it is built.
    """
    names = list(dict.fromkeys(policies))
    out: dict[str, dict] = {name: {} for name in names}
    if config:
        if len(names) != 1:
            raise ConfigError(f"--policy-config applies to one policy, but {len(names)} are in play ({', '.join(names)})")
        out[names[0]].update(read_yaml_mapping(config, "--policy-config file"))
    for item in items:
        head, sep, value = item.partition("=")
        head = head.strip()
        policy, dot, key = head.rpartition(".") if "." in head else ("", "", head)
        if not sep or not key:
            raise ConfigError(f"--policy-arg {item!r}: expected [POLICY.]KEY=VALUE, e.g. seed=3 or random.seed=3")
        if dot:
            if policy not in out:
                raise ConfigError(f"--policy-arg {item!r}: policy {policy!r} is not in play "
                                  f"(policies: {', '.join(names) or 'none'})")
        elif len(names) == 1:
            policy = names[0]
        else:
            raise ConfigError(f"--policy-arg {item!r}: {len(names)} policies are in play ({', '.join(names)}); "
                              f"name one: POLICY.{head}=VALUE")
        out[policy][key] = parse_scalar(value)
    return out


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))
