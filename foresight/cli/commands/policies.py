"""``foresight policies``: list the registered eviction policies."""

from __future__ import annotations

from foresight.cli.args import print_json


def register(sub) -> None:
    p = sub.add_parser("policies", help="list eviction policies")
    p.add_argument("--json", action="store_true", help="print a JSON list of names")
    p.set_defaults(func=run)


def run(args) -> int:
    from foresight.policies import POLICIES, policy_names

    if args.json:
        print_json(policy_names())
        return 0
    for name in policy_names():
        doc = (POLICIES[name].__doc__ or "").strip().splitlines()[0] if POLICIES[name].__doc__ else ""
        print(f"{name:16s} {doc}")
    return 0
