"""Export a trained scorer as a self-contained, shareable checkpoint (and optionally ONNX), with its adapter.

The export holds ``config.json`` + ``model.safetensors`` (loadable with :meth:`foresight.scorer.Scorer.from_pretrained`),
a generated model card ``README.md`` (:mod:`evaluation.model_card`: base model, B/W, features, provenance, evaluation
numbers when a ``fidelity.json`` or a training ``summary.json`` with fidelity results is found,
:mod:`evaluation.card_records`) and, with ``onnx=True``, ``scorer.onnx`` (:mod:`evaluation.onnx_export`): the
all-layers form ``scorer(x) -> scores``, x (L, batch, Hkv, n, D) -> (L, batch, Hkv, n) with dynamic batch and n,
checked against PyTorch with onnxruntime. With ``adapter=DIR`` the export also holds ``adapter/``, a peft adapter
(``foresight train adapt`` output) in peft's own format, and the card says which policy, B and W it was trained under
(:mod:`evaluation.export_adapter`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import shutil
import subprocess
from pathlib import Path

from evaluation.card_records import check_card_cache, check_card_topk_defaults, find_fidelity, is_learned
from evaluation.export_adapter import (ADAPTER_SUBDIR, adapter_card, adapter_summary, bind_scorer, check_scorer_base,
                                       paired_with, resolve_adapter_dir, write_adapter)
from evaluation.model_card import model_card
from evaluation.onnx_export import ONNX_NAME, export_onnx
from foresight import __version__
from foresight.atomic import atomic_directory
from foresight.errors import ForesightError
from foresight.fingerprint import file_sha256
from foresight.outputs import OutputKind, check_output, clean_after_killed_writes, write_marker
from foresight.scorer import CONFIG_NAME, WEIGHTS_NAME, Scorer, resolve_scorer

#: ``export``'s output directory: what :func:`export_scorer` writes (known by its scorer before output markers).
EXPORT_OUTPUT = OutputKind("export", (CONFIG_NAME, WEIGHTS_NAME, "README.md", "fidelity.json", ONNX_NAME,
                                      ADAPTER_SUBDIR), ((CONFIG_NAME, WEIGHTS_NAME),))


def resolve_scorer_dir(path: str | Path) -> Path:
    """A scorer directory from ``path``: the directory itself, its ``scorer/`` (training output) or the
    ``scorer/`` of its newest checkpoint (``checkpoints/latest``)."""
    path = resolve_scorer(path)  # a shipped scorer's short name works too
    if not path.exists():
        raise ForesightError(f"scorer path not found: {path}")
    candidates = [path, path / "scorer"]
    latest = path / "checkpoints" / "latest"
    if latest.is_file():
        candidates.append(path / "checkpoints" / latest.read_text().strip() / "scorer")
    for c in candidates:
        if (c / CONFIG_NAME).is_file() and (c / WEIGHTS_NAME).is_file():
            return c
    raise ForesightError(
        f"{path} holds no scorer (looked for {CONFIG_NAME} + {WEIGHTS_NAME} in it, in scorer/ and in the latest "
        "checkpoint); pass a `foresight train` output directory or a scorer directory"
    )


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _check_out(out: Path, scorer_dir: Path, overwrite: bool) -> None:
    """Refuse an ``out`` that would lose work: anything :func:`foresight.outputs.check_output` refuses (another
    kind's output, files foresight did not write, the current directory, a symbolic link), a non-empty directory
    without ``overwrite``, or a directory holding the source scorer (replacing it would delete the source)."""
    src, dst = scorer_dir.resolve(), out.resolve()
    if dst == src or dst in src.parents:
        raise ForesightError(f"--out {out} holds the source scorer {scorer_dir}; export to another directory")
    check_output(out, EXPORT_OUTPUT, overwrite=overwrite)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ForesightError(f"export directory {out} already exists; pass --overwrite to replace it (its whole "
                             "content, so no file of an earlier export is left beside the new scorer)")


def _set_temperature(scorer, temperature: float | None, prov: dict) -> None:
    """Record the ``selection=sample`` temperature in the exported config; refuses a non-positive or non-finite one,
    and one that differs from a temperature the scorer was trained with (GRPO's). A temperature that an earlier
    export chose for a scorer trained without one (SL + DAgger) may be replaced: ``prov`` then records the old value
    as ``temperature_replaced`` and drops the ``temperature_note`` that described it."""
    if temperature is None:
        return
    try:  # the config validates its own fields
        config = dataclasses.replace(scorer.config, temperature=float(temperature))
    except ValueError as exc:
        raise ForesightError(f"--temperature {temperature}: {exc}") from None
    old = scorer.config.temperature
    if old is not None and float(old) != config.temperature:
        if "grpo" in prov or "exported_at" not in prov:
            raise ForesightError(f"--temperature {temperature}: the scorer already records temperature {old:g} (the "
                                 "one its sampled evictions were trained with); export it without --temperature")
        prov["temperature_replaced"] = f"{old:g}"
        prov.pop("temperature_note", None)
    scorer.config = config


def _set_topk_defaults(scorer, values: dict[str, float | None]) -> None:
    """Record each given value (name in :data:`~foresight.scorer.TOPK_DEFAULTS`; ``None`` = keep the recorded one)
    as a default of the ``learned`` policy's ``selection=topk`` in the exported config (the config validates it: a
    finite number >= 0)."""
    for name, value in values.items():
        if value is None:
            continue
        try:
            scorer.config = dataclasses.replace(scorer.config, **{name: float(value)})
        except ValueError as exc:
            raise ForesightError(f"--{name.replace('_', '-')} {value}: {exc}") from None


def _set_selection(scorer, selection: str | None) -> None:
    """Record ``selection`` as the ``learned`` policy's default selection in the exported config (the config
    validates it: one of ``topk``/``sample``, and ``sample`` only with a recorded temperature)."""
    if selection is None:
        return
    try:
        scorer.config = dataclasses.replace(scorer.config, selection=selection)
    except ValueError as exc:
        hint = "; record one with --temperature T" if selection == "sample" else ""
        raise ForesightError(f"--selection {selection}: {exc}{hint}") from None


def _set_cache(scorer, budget: int | None, interval: int | None, prov: dict) -> bool:
    """Record the (B, W) of the cache the exported scorer runs in, when it is not the one it was trained at (a
    transfer measured on held-out traces before it is recorded): :meth:`~foresight.scorer.ScorerConfig.moved_to`
    (its ``window`` keeps the W the scorer was trained at), and ``prov`` records ``trained_at`` (the first move's,
    when a moved scorer is moved again). Returns whether the scorer moved."""
    if budget is None and interval is None:
        return False
    if budget is None or interval is None:
        raise ForesightError("--budget and --interval go together: the (B, W) of the cache the exported scorer runs "
                             f"in (got only {'--budget' if interval is None else '--interval'})")
    cfg = scorer.config
    try:  # the config validates its own fields (0 < W < B)
        scorer.config = cfg.moved_to(budget, interval)
    except ValueError as exc:
        raise ForesightError(f"--budget {budget} --interval {interval}: {exc}") from None
    moved = (budget, interval) != (cfg.budget, cfg.interval)
    if moved:
        prov.setdefault("trained_at", {"budget": cfg.budget, "interval": cfg.interval})
    return moved


def _add_notes(prov: dict, notes: dict[str, str] | None) -> None:
    """Add ``notes`` (provenance key -> text) to ``prov``; refuses an empty key and one the provenance already has."""
    for key, text in (notes or {}).items():
        if not key or not key.strip():
            raise ForesightError(f"--note {key}={text}: the key is empty")
        if key in prov:
            raise ForesightError(f"--note {key}: the scorer's provenance already records {key}; choose another key")
        prov[key] = text


def _stamp_export(prov: dict, scorer_dir: Path) -> None:
    """Record this export in ``prov``: when, with which version and commit. A re-export (of an earlier export's
    directory) records its own commit beside its own time; the earlier export's commit is kept as
    ``first_export_git_commit`` (the first one's, when there were several), and ``exported_from`` stays the
    directory the scorer was trained into."""
    prov.setdefault("exported_from", str(scorer_dir.resolve()))
    prov["exported_at"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    prov["foresightkv_version"] = __version__
    earlier = prov.pop("export_git_commit", None)
    if earlier:
        prov.setdefault("first_export_git_commit", earlier)
    commit = _git_commit()
    if commit:  # without one, no commit is claimed for this export (an earlier one's would be wrong)
        prov["export_git_commit"] = commit


def export_scorer(src: str | Path, out: str | Path, *, onnx: bool = False, fidelity: str | Path | None = None,
                  atol: float = 1e-5, overwrite: bool = False, adapter: str | Path | None = None,
                  temperature: float | None = None, spread: float | None = None,
                  newcomer_bonus: float | None = None, age_prior: float | None = None, selection: str | None = None,
                  notes: dict[str, str] | None = None, budget: int | None = None,
                  interval: int | None = None, base_model: str | None = None) -> dict:
    """Write a self-contained scorer checkpoint from ``src`` (scorer or training output dir) into ``out``.

    ``temperature`` records the temperature ``selection=sample`` uses by default (for a scorer trained without one,
    e.g. SL + DAgger; re-exporting such a scorer may replace the one an earlier export recorded); ``spread`` records
    the ``spread`` that ``selection=topk`` uses by default, ``newcomer_bonus`` its newcomer margin and ``age_prior``
    its age prior (quoted top-k fidelity records must have run at all three); ``selection`` records the selection
    the ``learned`` policy runs the scorer with by default (``topk`` or ``sample``; chosen on held-out trace sets);
    ``notes`` adds provenance entries (how the scorer was chosen, the recipe), quoted in the card. ``budget`` and
    ``interval`` (together) move the scorer to a cache of another (B, W), keeping the feature window it was trained
    with (:func:`_set_cache`; the ``learned`` policy then runs it there without ``any_budget``); its card then quotes
    only ``fidelity`` records whose learned rows were measured in that cache (none is looked for beside it).

    ``base_model`` is the Hub id of the language model the scorer serves, for the card's metadata (default: known from
    the fingerprint when it names a built-in model or a Hub id).

    ``adapter`` (an adapter directory or a ``train adapt`` output directory) is written to ``out/adapter`` in peft's
    format and described in the model card (:mod:`evaluation.export_adapter`).

    Everything is written into a temporary sibling of ``out`` and renamed into place at the end, so a failure
    (a broken scorer, an ONNX mismatch, a kill) leaves an earlier ``out`` untouched. An existing non-empty ``out``
    is refused unless ``overwrite``; then it is replaced as a whole. A killed run may leave a hidden
    ``.<out>.tmp-*`` sibling behind, which is safe to delete.

    Returns ``{"out", "scorer_dir", "onnx_max_abs_diff", "fidelity_source", "adapter"}`` (``adapter``: None, or
    its policy, B, W, weights SHA-256 and whether the scorer was bound to it).
    """
    src = Path(src)
    scorer_dir = resolve_scorer_dir(src)
    out = Path(out)
    _check_out(out, scorer_dir, overwrite)
    scorer = Scorer.from_pretrained(scorer_dir)  # refuses NaN/Inf weights
    prov = dict(scorer.config.provenance or {})
    _set_temperature(scorer, temperature, prov)
    _set_topk_defaults(scorer, {"spread": spread, "newcomer_bonus": newcomer_bonus, "age_prior": age_prior})
    _set_selection(scorer, selection)
    moved = _set_cache(scorer, budget, interval, prov)
    _add_notes(prov, notes)
    _stamp_export(prov, scorer_dir)
    scorer.config.provenance = prov
    sha = file_sha256(scorer_dir / WEIGHTS_NAME)  # the weights are copied byte for byte: the export's too
    # read before anything is written; a moved scorer's card is never one found beside it (measured where it was)
    fid = find_fidelity(src, scorer_dir, sha, fidelity) if fidelity is not None or not moved else None
    if fid:
        check_card_topk_defaults(fid[0], scorer.config, f"fidelity results {fid[1]}")
        if moved:
            check_card_cache(fid[0], scorer.config, f"fidelity results {fid[1]}")
    adapter_dir = resolve_adapter_dir(adapter) if adapter is not None else None
    if adapter_dir is not None:
        check_scorer_base(adapter_dir, scorer)
    paired = adapter_dir is not None and paired_with(adapter_dir, scorer_dir)
    if paired:
        bind_scorer(scorer, adapter_dir)
    clean_after_killed_writes(out)
    with atomic_directory(out) as tmp:  # out never holds a half-written export or a mix of two
        write_marker(tmp, EXPORT_OUTPUT)
        # the config gains provenance; the weights are copied as trained, byte for byte, so their SHA-256 stays the
        # one that training output, quality.json and adapter pairing recorded
        scorer.save_config(tmp)
        shutil.copyfile(scorer_dir / WEIGHTS_NAME, tmp / WEIGHTS_NAME)
        if fid:  # each learned record names the weights it measured, so a re-export can check them again
            stamped = [{**r, "scorer_sha256": sha} if is_learned(r) else r for r in fid[0]]
            (tmp / "fidelity.json").write_text(json.dumps(stamped, indent=2) + "\n")
        diff = export_onnx(scorer, tmp / ONNX_NAME, atol=atol) if onnx else None
        lines = None
        if adapter_dir is not None:
            write_adapter(adapter_dir, tmp / ADAPTER_SUBDIR)
            lines = adapter_card(adapter_dir, out, paired)
        (tmp / "README.md").write_text(model_card(scorer, out, fid, diff, files_at=tmp, adapter_lines=lines,
                                                  base_model=base_model))
    return {"out": str(out), "scorer_dir": str(scorer_dir), "onnx_max_abs_diff": diff,
            "fidelity_source": fid[1] if fid else None,
            "adapter": {**adapter_summary(adapter_dir), "paired": paired} if adapter_dir is not None else None}


__all__ = ["EXPORT_OUTPUT", "export_scorer", "resolve_scorer_dir"]
