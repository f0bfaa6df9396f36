"""The model card's fidelity table for a scorer measured by the quality benchmark (``card_fidelity.json``).

``foresight export --fidelity FILE`` quotes a list of fidelity records in the model card. For a shipped scorer
that list is picked out of quality-benchmark runs: golden and the best heuristic of the run that measured the
scorer's top-k stage, that stage, and the same scorer's sampled stage (often a second run, ``--scorer-arg
selection=sample``). The two learned records are relabelled so the card says which rows are this scorer; each keeps
its ``stage`` and ``source`` file. Both stages must be the same scorer weights (the SHA-256 each run recorded; for
runs older than that record, the same scorer directory) on the same traces and model (scored tokens, full-cache
CE) and trace ids, measured as ``learned`` runs the scorer by default (no other policy argument at a non-default
value: no ``any_budget`` transfer; a top-k stage's spread, newcomer bonus and age prior are
quoted with it, and ``foresight export`` checks them against the scorer's recorded top-k defaults; a sampled stage's
newcomer bonus and age prior must be 0); anything else is refused. The learned records carry the
weights' SHA-256 when the runs recorded it (``scorer_sha256``), which ``foresight export --fidelity`` checks against
the exported scorer. Stages measured by ``foresight eval fidelity`` alone (``fidelity.json:learned``) take golden and
the best heuristic from ``--reference``, a quality benchmark run on the same traces.

    python benchmarks/quality/card.py --budget 64 --interval 16 \\
        --topk runs/quality_B64_recipe336/quality.json:dagger \\
        --sample runs/quality_B64_recipe336/sampled/quality.json:dagger_sample \\
        --out runs/quality_B64_recipe336/card_fidelity.json
    python benchmarks/quality/card.py --budget 64 --interval 16 \\
        --topk runs/quality_B64_prekey_dagger/ev_held_r3/fidelity.json:learned \\
        --sample runs/quality_B64_prekey_dagger/ev_held_r3_sample/fidelity.json:learned \\
        --reference runs/quality_B64_recipe336/quality.json \\
        --out runs/quality_B64_prekey_dagger/card_fidelity.json
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from evaluation.quality import check_comparable, load_record, same_traces
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.policies.learned import LearnedPolicy
from foresight.scorer import TOPK_DEFAULTS

# learned-policy arguments whose non-default value makes a stage something other than this scorer at its (B, W):
# every argument but these, so one added to the policy later is refused until someone decides otherwise
QUOTED = ("scorer", "selection", "temperature", *TOPK_DEFAULTS, "seed", "on_features")
UNQUOTED = {f.name: f.default for f in dataclasses.fields(LearnedPolicy) if f.init and f.name not in QUOTED}


def _selection(record: dict, spec: str) -> tuple[str, dict[str, float]]:
    """(selection, {temperature, spread, newcomer_bonus, age_prior}) the stage was measured with, from its record's
    resolved policy config (records from before a top-k default existed ran at 0)."""
    cfg = record.get("policy_config") or {}
    if not isinstance(cfg, dict) or "selection" not in cfg or "temperature" not in cfg:
        raise ForesightError(f"{spec}: the record has no policy_config with selection and temperature")
    numbers = {k: cfg.get(k, 0.0) for k in ("temperature", *TOPK_DEFAULTS)}
    for k, v in numbers.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ForesightError(f"{spec}: policy_config {k} must be a number, got {v!r}")
    # the card quotes the scorer as `learned` runs it at its own (B, W): a bonus, or a transfer to another (B, W),
    # measured something else under "this scorer"
    changed = [f"{k}={cfg[k]}" for k, default in UNQUOTED.items() if k in cfg and cfg[k] != default]
    if changed:
        raise ForesightError(f"{spec}: measured with {', '.join(changed)}; the card quotes this scorer as the learned "
                             "policy runs it by default (a stage measured without them)")
    return cfg["selection"], {k: float(v) for k, v in numbers.items()}


def _scorer_identity(meta: dict, stage: str, budget: int, interval: int) -> tuple[str | None, str | None]:
    """(weights SHA-256, scorer directory) a run recorded for ``stage``: a quality.json's per-stage maps, or the
    one scorer of a ``foresight eval fidelity`` run's settings.json. Older runs record no SHA-256."""
    key = f"{stage}@B{budget}W{interval}"
    sha, where = meta.get("scorer_sha256"), meta.get("scorers")
    if isinstance(sha, dict) or isinstance(where, dict):
        return (sha or {}).get(key), (where or {}).get(key)
    return sha, meta.get("scorer")


def _golden_and_best(run_file: str, budget: int, interval: int) -> tuple[dict, list[dict]]:
    """(meta, [golden, best heuristic]) of the quality benchmark run ``run_file`` at (budget, interval)."""
    try:
        data = json.loads(Path(run_file).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForesightError(f"{run_file}: not a readable quality.json ({exc})") from None
    summaries = data.get("summaries", []) if isinstance(data, dict) else []
    summary = next((s for s in summaries if isinstance(s, dict)
                    and (s.get("budget"), s.get("interval")) == (budget, interval)), None)
    if summary is None or not summary.get("best_heuristic"):
        raise ForesightError(f"{run_file}: no quality summary with a best heuristic at B={budget} W={interval} "
                             "(a fidelity.json stage takes them from --reference, a quality.json on the same traces)")
    # the two records, checked as every stage is (a list of records, each with the keys a comparison reads)
    (meta, golden), (_, best) = (load_record(f"{run_file}:{name}", budget, interval)
                                 for name in ("golden", summary["best_heuristic"]))
    return meta, [golden, best]


def card_records(topk_spec: str, sample_spec: str, budget: int, interval: int,
                 reference: str | None = None) -> list[dict]:
    """golden, the best heuristic, the top-k stage and the sampled stage, relabelled (see the module docstring);
    golden and the best heuristic come from ``reference`` when given, else from the top-k stage's run."""
    meta_t, topk = load_record(topk_spec, budget, interval)
    meta_s, sample = load_record(sample_spec, budget, interval)
    topk_file, _, topk_stage = topk_spec.rpartition(":")
    sample_file, _, sample_stage = sample_spec.rpartition(":")
    check_comparable(meta_t, topk, meta_s, sample, topk_spec, sample_spec)
    same_traces(topk, sample, topk_spec, sample_spec)
    (sha_t, dir_t), (sha_s, dir_s) = (_scorer_identity(meta_t, topk_stage, budget, interval),
                                      _scorer_identity(meta_s, sample_stage, budget, interval))
    weights = sha_t if sha_t is not None and sha_t == sha_s else None  # what `foresight export` checks
    if sha_t is None or sha_s is None:  # runs from before results recorded weights: the same directory at least
        sha_t, sha_s = dir_t, dir_s
    if sha_t is None or sha_t != sha_s:
        raise ForesightError(f"{topk_spec} and {sample_spec}: not recorded as the same scorer ({sha_t} vs {sha_s})")
    (topk_selection, topk_args), (selection, sample_args) = _selection(topk, topk_spec), _selection(sample, sample_spec)
    if topk_selection != "topk":
        raise ForesightError(f"{topk_spec}: measured with selection={topk_selection}, not topk")
    if selection != "sample":
        raise ForesightError(f"{sample_spec}: measured with selection={selection}, not sample")
    for k in TOPK_DEFAULTS:  # the scorer's recorded values are top-k's: sampling by default adds none
        if sample_args[k]:
            raise ForesightError(f"{sample_spec}: measured with {k}={sample_args[k]:g}; the card quotes selection="
                                 f"sample as the learned policy runs it by default (no {k.replace('_', ' ')})")
    meta_r, (golden, best) = _golden_and_best(reference or topk_file, budget, interval)
    if reference:
        for r in (golden, best):
            name = f"{reference}:{r['policy']}"
            check_comparable(meta_r, r, meta_t, topk, name, topk_spec)
            same_traces(r, topk, name, topk_spec)
    named = {"scorer_sha256": weights} if weights else {}
    label = "learned (this scorer, top-k" + "".join(f", {k.replace('_', ' ')} {topk_args[k]:g}"
                                                     for k in TOPK_DEFAULTS if topk_args[k]) + ")"
    keep = [golden, {**topk, "policy": label, "stage": topk_stage, "source": topk_file, **named}, best]
    keep.append({**sample, "policy": f"learned (this scorer, selection=sample T={sample_args['temperature']:g})",
                 "stage": sample_stage, "source": sample_file, **named})
    return keep


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topk", required=True, help="FILE:STAGE of the scorer measured with top-k selection")
    p.add_argument("--sample", required=True, help="FILE:STAGE of the same scorer measured with selection=sample")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--interval", type=int, required=True)
    p.add_argument("--reference", default=None, metavar="FILE",
                   help="quality.json on the same traces to take golden and the best heuristic from (default: the "
                        "--topk run's)")
    p.add_argument("--out", required=True, help="card_fidelity.json to write (for foresight export --fidelity)")
    args = p.parse_args(argv)
    records = card_records(args.topk, args.sample, args.budget, args.interval, args.reference)
    try:
        Path(args.out).write_text(json.dumps(records, indent=1))
    except OSError as exc:
        raise ForesightError(f"--out {args.out}: cannot write ({exc.strerror})") from None
    print(args.out, ", ".join(f"{r['policy']} {r['loss_ratio']:.4f}" for r in records))
    return 0


if __name__ == "__main__":
    run_script(main, "card")
