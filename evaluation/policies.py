"""Building evaluation policies from names and CLI options: plain registry policies, ``golden`` (needs labels
for each budget) and ``learned`` (needs a scorer checkpoint). ``--policy-arg`` has one parser for every command,
:func:`foresight.cli.args.parse_policy_args`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from foresight.config import ConfigError
from foresight.errors import ForesightError
from foresight.policies import make_policy
from foresight.policies.registry import check_policy_names
from golden.labels import LabelMismatchError, check_labels_match, load_labels, merge_labels


def parse_policies(spec: str) -> list[str]:
    """Split ``"a,b,c"`` into names and check each is registered (``wrapper:inner`` checks both parts)."""
    names = [p.strip() for p in spec.split(",") if p.strip()]
    if not names:
        raise ForesightError("no policies given")
    return check_policy_names(names, "--policies")


def parse_budgets(spec: str | int | list, interval: int | None = None) -> list[int]:
    """Parse ``"256,512"`` into sorted unique positive budgets, each larger than ``interval``."""
    items = spec if isinstance(spec, list) else str(spec).split(",")
    out = []
    for item in items:
        try:
            b = int(str(item).strip())
        except ValueError:
            raise ForesightError(f"bad budget {item!r}: expected a positive integer (or a comma-separated list)")
        if b <= 0:
            raise ForesightError(f"bad budget {b}: must be a positive integer")
        if interval is not None and b <= interval:
            raise ForesightError(f"bad budget {b}: must be larger than the interval W={interval}")
        out.append(b)
    if not out:
        raise ForesightError("no budget given")
    return sorted(set(out))


def _is_golden_dir(path: Path) -> bool:
    plan = path / "plan.json"
    if not plan.is_file():
        return False
    try:
        return json.loads(plan.read_text()).get("kind") == "foresight-golden"
    except (OSError, ValueError):
        return False


def golden_label_sets(root: str | Path) -> list[Path]:
    """Label locations under ``root``: ``root`` itself when it is a label file or golden output directory,
    otherwise its immediate subdirectories / ``*.safetensors`` files."""
    root = Path(root)
    if not root.exists():
        raise ForesightError(f"golden label path not found: {root}")
    if root.is_file() or _is_golden_dir(root):
        return [root]
    found = sorted(p for p in root.iterdir() if _is_golden_dir(p) or (p.is_file() and p.suffix == ".safetensors"))
    if not found:
        raise ForesightError(f"{root} holds no golden labels (no `foresight golden` output inside)")
    return found


def golden_factory(root: str | Path, interval: int) -> Callable[[int], dict]:
    """``labels_for(budget)``: the golden labels made for (budget, interval) under ``root``.

    Raises :class:`golden.labels.LabelMismatchError` naming both settings when ``root`` holds no labels for
    them (a golden row silently missing from a table reads as "golden was not run", not "wrong labels"), and
    :class:`ForesightError` naming both sets when a trace is labelled in two of those made for them."""
    sets = golden_label_sets(root)
    cache: dict[Path, dict] = {}

    def labels_for(budget: int) -> dict:
        matching = []
        have = set()
        for path in sets:
            if path not in cache:
                cache[path] = load_labels(path)
            labels = cache[path]
            first = next(iter(labels.values()), None)
            if first is None:
                continue
            have.add((first.budget, first.interval))
            if first.budget == budget and first.interval == interval:
                matching.append((path, labels))
        merged = merge_labels(matching)  # a trace labelled in two sets is refused, not taken from the later one
        if not merged:
            made = ", ".join(f"B={b} W={w}" for b, w in sorted(have)) or "nothing"
            raise LabelMismatchError(
                f"golden labels in {root} were made for {made}, not B={budget} W={interval}; run `foresight "
                f"golden --budget {budget} --interval {interval}` or evaluate golden only at the labelled budgets"
            )
        return merged

    return labels_for


def make_factory(
    *,
    model=None,
    scorer: str | None = None,
    golden: str | Callable[[int], dict] | None = None,
    interval: int | None = None,
    policy_kwargs: dict[str, dict] | None = None,
) -> Callable[[str, int], object]:
    """``factory(name, budget)`` for :func:`evaluation.fidelity.evaluate_fidelity` and the other evaluations.

    ``learned`` is built with ``scorer=<dir>``; ``golden`` with the labels for each budget (an error when there
    are none), from the label root ``golden`` or a :func:`golden_factory` already built (its labels already read);
    every other name from the registry with ``policy_kwargs[name]``.
    """
    kwargs = policy_kwargs or {}
    labels_for = (golden if callable(golden) else golden_factory(golden, interval)) if golden else None
    learned_cache: dict = {}

    def factory(name: str, budget: int):
        extra = dict(kwargs.get(name, {}))
        check_own_inputs([name], kwargs)  # a scorer or labels beside the factory's own: a TypeError traceback
        if name == "learned":
            if not scorer:
                raise ForesightError("policy 'learned' needs --scorer DIR (a trained or exported scorer)")
            if "policy" not in learned_cache:
                learned_cache["policy"] = make_policy("learned", scorer=scorer, **extra)
                check = getattr(getattr(learned_cache["policy"], "model", None), "check_compatible", None)
                if model is not None and callable(check):
                    check(model)
            return learned_cache["policy"]
        if name == "golden":
            if labels_for is None:
                raise ForesightError("policy 'golden' needs --golden DIR (the output of `foresight golden`)")
            labels = labels_for(budget)  # raises when there are none for this (B, W)
            if model is not None:
                check_labels_match(labels, model, budget, interval)
            return make_policy("golden", labels=labels, **extra)
        return make_policy(name, **extra)

    return factory


def check_own_inputs(names: Sequence[str], policy_kwargs: dict[str, dict] | None) -> None:
    """Refuse a ``learned`` scorer or ``golden`` labels given as a hyperparameter (``--policy-arg``): the commands
    take them from ``--scorer`` / ``--golden`` only."""
    for name, key, flag in (("learned", "scorer", "--scorer"), ("golden", "labels", "--golden")):
        if name in names and key in (policy_kwargs or {}).get(name, {}):
            raise ConfigError(f"--policy-arg {name}.{key}: this command takes the {name} policy's {key} from {flag} "
                              f"DIR only; drop the --policy-arg")


def check_requirements(names: list[str], scorer: str | None, golden: str | None,
                       policy_kwargs: dict[str, dict] | None = None) -> None:
    """Fail early (before loading a model) when ``learned``/``golden`` lack their inputs, get them twice (their
    ``scorer`` / ``labels`` hyperparameter also in ``policy_kwargs`` (``--policy-arg``), which
    :func:`make_factory` would pass beside ``--scorer`` / ``--golden``), or get them while not in play (the
    argument would be ignored)."""
    check_own_inputs(names, policy_kwargs)
    for name, given, flag in (("learned", scorer, "--scorer"), ("golden", golden, "--golden")):
        if given and name not in names:  # silently unused, it would still be recorded with the results
            raise ConfigError(f"{flag} {given}: only the {name} policy uses it, and it is not in play "
                              f"(policies: {', '.join(names) or 'none'}); add {name} or drop {flag}")
    if "learned" in names and not scorer:
        raise ForesightError("policy 'learned' needs --scorer DIR (a trained or exported scorer)")
    if "golden" in names and not golden:
        raise ForesightError("policy 'golden' needs --golden DIR (the output of `foresight golden`)")


__all__ = ["check_own_inputs", "check_requirements", "golden_factory", "make_factory", "parse_budgets",
           "parse_policies"]
