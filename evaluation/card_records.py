"""Which fidelity records a scorer's model card may quote (:func:`evaluation.export.export_scorer`).

Records are found beside the scorer or given explicitly (:func:`find_fidelity`); a card quotes ``learned`` records
only when they are identified as the exported weights (:func:`measured_other`), measured in the cache the scorer
runs in (:func:`check_card_cache`) and at its top-k defaults (:func:`check_card_topk_defaults`).
"""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.quality import check_record_values
from foresight.config import read_json
from foresight.errors import ForesightError
from foresight.scorer import TOPK_DEFAULTS


def is_learned(record: dict) -> bool:
    return str(record.get("policy", "")).startswith("learned")


def check_card_records(records, where: str) -> None:
    """Refuse fidelity records the card cannot quote: not a non-empty list of objects with a ``policy``, or values
    of the wrong type (:func:`evaluation.quality.check_record_values`; ``budget`` an integer), so a foreign file is
    one line, not a traceback while the card is sorted."""
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) and isinstance(r.get("policy"), str)
                                                                  for r in records):
        raise ForesightError(f"{where} must hold a non-empty list of fidelity records (objects with a `policy`, as "
                             "`foresight eval fidelity` writes them)")
    for r in records:
        check_record_values(r, f"{where}: record {r['policy']!r}", finite=False)  # the card prints NaN as n/a
        if "budget" in r and (not isinstance(r["budget"], int) or isinstance(r["budget"], bool)):
            raise ForesightError(f"{where}: record {r['policy']!r}: 'budget' must be an integer, got {r['budget']!r}")


def measured_other(path: Path, records: list, sha: str) -> str | None:
    """Why the ``learned`` records of ``path`` cannot be quoted as measuring the scorer weights ``sha``; None when
    each is identified as this scorer: by its own ``scorer_sha256`` (``benchmarks/quality/card.py`` and this export
    write one) or by the ``scorer_sha256`` of the ``foresight eval fidelity`` run's ``settings.json`` beside it.
    Records that name no weights are not quoted: a card would otherwise present any scorer's numbers as this one's."""
    settings = path.with_name("settings.json")
    recorded = None
    if settings.is_file():
        try:
            recorded = json.loads(settings.read_text()).get("scorer_sha256")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            recorded = None
    for r in records:
        if not is_learned(r):
            continue
        named = [v for v in (r.get("scorer_sha256"), recorded) if v]
        if not named:
            return (f"its record {r['policy']!r} does not say which scorer weights it measured (no scorer_sha256 in "
                    f"the record or in {settings})")
        other = next((v for v in named if v != sha), None)
        if other:
            return f"its record {r['policy']!r} measured another scorer (weights sha256 {str(other)[:12]}…)"
    return None


def _summary_fidelity(path: Path, scorer_dir: Path) -> list | None:
    """The fidelity records of a training ``summary.json`` that measured ``scorer_dir``: the summary of the run whose
    final scorer it is (``<out_dir>/scorer`` beside it, recorded as its ``scorer`` entry), else None."""
    if (path.parent / "scorer").resolve() != scorer_dir.resolve():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("scorer"), str):
        return None
    fid = (data.get("eval") or {}).get("fidelity") if isinstance(data.get("eval"), dict) else None
    return fid or data.get("fidelity")


def find_fidelity(src: Path, scorer_dir: Path, sha: str,
                  explicit: str | Path | None = None) -> tuple[list[dict], str] | None:
    """Fidelity records for the model card: ``explicit``, else a ``fidelity.json`` next to the scorer or in the
    source directory whose learned records are identified as the scorer weights ``sha`` (:func:`measured_other`), or
    the ``fidelity`` entry of the training ``summary.json`` that trained it. ``explicit`` records that are malformed
    or not identified as this scorer are refused; found ones are passed over."""
    if explicit is not None:
        p = Path(explicit)
        if p.is_dir():
            p = p / "fidelity.json"
        if not p.is_file():
            raise ForesightError(f"fidelity results not found: {p}")
        records = read_json(p, "--fidelity results", expect=list)
        check_card_records(records, f"--fidelity {p}")
        other = measured_other(p, records, sha)
        if other:
            raise ForesightError(f"--fidelity {p}: {other}, not {scorer_dir} ({sha[:12]}…); pass this scorer's "
                                 "evaluation (`foresight eval fidelity --scorer` it, or `benchmarks/quality/card.py`)")
        return records, str(p)
    for d in dict.fromkeys([scorer_dir, src, src.parent]):
        for name in ("fidelity.json", "eval/fidelity.json"):
            if (d / name).is_file():
                records = read_json(d / name, "fidelity results", expect=list)
                try:
                    check_card_records(records, str(d / name))
                except ForesightError:
                    continue
                if not measured_other(d / name, records, sha):
                    return records, str(d / name)
        if (d / "summary.json").is_file():
            fid = _summary_fidelity(d / "summary.json", scorer_dir)
            if isinstance(fid, list) and fid:
                try:
                    check_card_records(fid, str(d / "summary.json"))
                except ForesightError:
                    continue
                return fid, str(d / "summary.json")
    return None


def check_card_cache(records: list, config, where: str) -> None:
    """Refuse quoted ``learned`` records of a scorer moved to another cache (``--budget --interval``) that were not
    measured in that cache: its card would present the numbers of the cache it left as the new one's."""
    for r in records:
        if is_learned(r) and (r.get("budget"), r.get("interval")) != (config.budget, config.interval):
            raise ForesightError(f"{where}: its record {r['policy']!r} was measured at B={r.get('budget')} "
                                 f"W={r.get('interval')}, and the exported scorer runs at B={config.budget} "
                                 f"W={config.interval}; quote runs in that cache")


def check_card_topk_defaults(records: list, config, where: str) -> None:
    """Refuse quoted ``learned`` top-k records run at another value of a top-k default
    (:data:`~foresight.scorer.TOPK_DEFAULTS`: spread, newcomer bonus, age prior) than the one this scorer's
    ``learned`` policy uses by default (its recorded value, else 0): the card would present plain top-k numbers as
    the default's, or the reverse. Records that name no selection are left alone; older ones that name no such
    value ran at 0."""
    for name in TOPK_DEFAULTS:
        default = float(getattr(config, name) or 0.0)
        flag = f"--{name.replace('_', '-')}"
        for r in records:
            cfg = r.get("policy_config") if is_learned(r) else None
            if not isinstance(cfg, dict) or cfg.get("selection") != "topk":
                continue
            ran = cfg.get(name, 0.0)
            if not isinstance(ran, (int, float)) or isinstance(ran, bool) or float(ran) != default:
                raise ForesightError(f"{where}: its record {r['policy']!r} ran top-k at {name} {ran!r}, and this "
                                     f"scorer's top-k default is {name} {default:g}; quote a run at {default:g}, or "
                                     f"export with {flag} {ran}")


__all__ = ["check_card_cache", "check_card_records", "check_card_topk_defaults", "find_fidelity", "is_learned",
           "measured_other"]
