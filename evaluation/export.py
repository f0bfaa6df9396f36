"""Export a trained scorer as a self-contained, shareable checkpoint (and optionally ONNX), with its adapter.

The export holds ``config.json`` + ``model.safetensors`` (loadable with :meth:`foresight.scorer.Scorer.from_pretrained`),
a generated model card ``README.md`` (base model, B/W, features, provenance, evaluation numbers when a
``fidelity.json`` or a training ``summary.json`` with fidelity results is found) and, with ``onnx=True``,
``scorer.onnx``: the all-layers form ``scorer(x) -> scores``, x (L, batch, Hkv, n, D) -> (L, batch, Hkv, n) with
dynamic batch and n, checked against PyTorch with onnxruntime. With ``adapter=DIR`` the export also holds
``adapter/``, a peft adapter (``foresight train adapt`` output) in peft's own format, and the card says which
policy, B and W it was trained under (:mod:`evaluation.export_adapter`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import torch

from evaluation.export_adapter import (ADAPTER_SUBDIR, adapter_card, adapter_summary, bind_scorer, check_scorer_base,
                                       paired_with, resolve_adapter_dir, write_adapter)
from evaluation.quality import check_record_values
from foresight import __version__
from foresight.atomic import atomic_directory
from foresight.config import read_json
from foresight.errors import ForesightError
from foresight.fingerprint import file_sha256
from foresight.outputs import OutputKind, check_output, clean_after_killed_writes, write_marker
from foresight.scorer import CONFIG_NAME, TOPK_DEFAULTS, WEIGHTS_NAME, Scorer, resolve_scorer
from foresight.scorer_hub import card_data, card_header

ONNX_NAME = "scorer.onnx"
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


def _is_learned(record: dict) -> bool:
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
        if not _is_learned(r):
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


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _provenance_value(v) -> str:
    """A provenance value for the card: long lists (trace ids) as their length, the whole list in config.json."""
    if isinstance(v, list) and len(v) > 8:
        return f"{len(v)} entries (listed in `config.json`)"
    return f"`{json.dumps(v, default=str) if not isinstance(v, str) else v}`"


def _fidelity_section(records: list[dict], source: str, config) -> list[str]:
    lines = ["## Evaluation", "", f"Fidelity on held-out traces (from `{source}`; lower loss ratio is better, "
             "1.0 = identical to the full cache):", ""]
    lines += ["| budget | policy | loss ratio | ΔCE (nats/token) | KL(full‖evicted) | top-1 agreement | tokens |",
              "|---:|---|---:|---:|---:|---:|---:|"]

    def num(v, d=4):
        return "n/a" if v is None or (isinstance(v, float) and v != v) else (f"{v:.{d}f}" if isinstance(v, float) else str(v))

    recs = sorted(records, key=lambda r: (r.get("budget") or config.budget,
                                          r.get("loss_ratio") if r.get("loss_ratio") == r.get("loss_ratio") else 1e9))
    for r in recs:
        lines.append(f"| {r.get('budget', config.budget)} | {r['policy']} | {num(r.get('loss_ratio'))} | "
                     f"{num(r.get('delta_ce'))} | {num(r.get('kl'))} | {num(r.get('top1_agreement'), 3)} | "
                     f"{r.get('tokens', 'n/a')} |")
    return lines + [""]


def _topk_defaults_text(cfg) -> str:
    """`` with spread 0.005, newcomer bonus 0.02`` for the top-k defaults a scorer config records (empty if none)."""
    parts = [f"{name.replace('_', ' ')} {getattr(cfg, name):g}" for name in TOPK_DEFAULTS if getattr(cfg, name)]
    return f" with {', '.join(parts)}" if parts else ""


def _cache_line(cfg) -> str:
    """The card's line on the (B, W) the scorer runs at, and the one it was trained at when it was moved."""
    trained = (cfg.provenance or {}).get("trained_at")
    if not cfg.window and not trained:
        return f"- trained at budget B = {cfg.budget}, interval W = {cfg.interval}"
    where = (f"trained at B = {trained.get('budget')}, W = {trained.get('interval')}; " if isinstance(trained, dict)
             else "")
    return (f"- runs at budget B = {cfg.budget}, interval W = {cfg.interval} ({where}its recent-query window stays "
            f"{cfg.feature_window})")


def _selection_defaults_text(cfg) -> str:
    """The selections a scorer config makes the ``learned`` policy run, its default first."""
    topk = "top-k" + _topk_defaults_text(cfg)
    sample = f"`selection=sample` at temperature {cfg.temperature:g}" if cfg.temperature else ""
    if cfg.selection == "sample":
        return f"{sample} (the default selection); `selection=topk`: {topk}"
    return topk + (f"; {sample}" if sample else "")


def model_card(scorer, out: Path, fidelity: tuple[list[dict], str] | None, onnx_diff: float | None,
               files_at: Path | None = None, adapter_lines: list[str] | None = None,
               base_model: str | None = None) -> str:
    """Markdown model card of an exported scorer at ``out`` (whose files are at ``files_at`` while being written),
    with ``adapter_lines`` (:func:`evaluation.export_adapter.adapter_card`) when an adapter is exported too. It opens
    with the Hub's YAML metadata (:func:`foresight.scorer_hub.card_data`: ``base_model``, given or known from the
    fingerprint, and the quoted fidelity as metrics with their traces)."""
    cfg = scorer.config
    fp = cfg.fingerprint
    n_params = sum(p.numel() for p in scorer.parameters())
    prov = cfg.provenance or {}
    lines = [
        card_header(card_data(cfg, records=fidelity[0] if fidelity else None,
                              source=fidelity[1] if fidelity else None, base_model=base_model)),
        f"# ForesightKV eviction scorer for `{fp.get('model', '?')}`",
        "",
        "A learned KV-cache eviction scorer (ForesightKV): a tiny MLP per (layer, KV head) "
        "that ranks cache entries (higher = keep), trained to imitate the Golden Eviction oracle.",
        "",
        "## Use",
        "",
        "```python",
        "import foresight",
        "from foresight.scorer import Scorer",
        "",
        f"model, tok = foresight.load_model({fp.get('model', 'MODEL')!r})",
        f"scorer = Scorer.from_pretrained({str(out)!r}, model=model)  # checks the model fits",
        "res = foresight.generate(model, tok, 'prompt', policy=foresight.make_policy('learned', scorer=scorer),",
        f"                         budget={cfg.budget}, interval={cfg.interval})",
        "```",
        "",
        f"CLI: `foresight eval fidelity --policies learned,full --scorer {out} --budget {cfg.budget} "
        f"--interval {cfg.interval} ...`",
        "",
        "## Details",
        "",
        f"- base model: `{fp.get('model', '?')}` ({fp.get('model_type')}, {fp.get('num_layers')} layers, "
        f"{fp.get('num_heads')} query heads, {fp.get('num_kv_heads')} KV heads, head_dim {fp.get('head_dim')})",
        _cache_line(cfg),
        "- `learned` policy defaults: " + _selection_defaults_text(cfg),
        f"- features: {', '.join(cfg.feature_set)} (input dim {cfg.input_dim}); hidden width {cfg.hidden}; "
        f"{n_params:,} parameters",
        f"- files: `config.json`, `{WEIGHTS_NAME}` (sha256 `{file_sha256((files_at or out) / WEIGHTS_NAME)[:16]}…`)"
        + (f", `{ONNX_NAME}` (max |ONNX − PyTorch| = {onnx_diff:.2e} on random inputs)" if onnx_diff is not None else ""),
        "",
        *(adapter_lines or []),
        "## Provenance",
        "",
    ]
    if prov:
        lines += [f"- {k}: {_provenance_value(v)}" for k, v in prov.items()]
    else:
        lines.append("- (the checkpoint records no provenance)")
    lines.append("")
    if fidelity:
        lines += _fidelity_section(fidelity[0], fidelity[1], cfg)
    else:
        lines += ["## Evaluation", "", "No fidelity results were found next to the checkpoint; run "
                  "`foresight eval fidelity` and re-export with `--fidelity`.", ""]
    return "\n".join(lines)


class _AllLayers(torch.nn.Module):
    """``scorer(x)`` with ``layer_idx=None`` as a plain module for the ONNX exporter."""

    def __init__(self, scorer):
        super().__init__()
        self.scorer = scorer

    def forward(self, x):
        return self.scorer(x)


def export_onnx(scorer, path: Path, atol: float = 1e-5, opset: int = 18) -> float:
    """Export ``scorer(x)`` (all layers) to ONNX with dynamic batch and n; return the max |ONNX - PyTorch|
    over random inputs of two shapes, raising if it exceeds ``atol``."""
    import onnxruntime as ort  # optional (the onnx extra): only the export needs it

    cfg = scorer.config
    scorer = scorer.float().eval()
    L, K, D = cfg.num_layers, cfg.num_kv_heads, cfg.input_dim
    gen = torch.Generator().manual_seed(0)
    example = torch.randn(L, 2, K, 7, D, generator=gen)
    wrapper = _AllLayers(scorer)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        wrapper, (example,), str(path), input_names=["features"], output_names=["scores"], opset_version=opset,
        dynamo=False, dynamic_axes={"features": {1: "batch", 3: "n"}, "scores": {1: "batch", 3: "n"}},
    )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for shape in ((L, 1, K, 5, D), (L, 3, K, 33, D)):
        x = torch.randn(*shape, generator=gen) * 2
        with torch.no_grad():
            ref = scorer(x).numpy()
        got = sess.run(["scores"], {"features": x.numpy()})[0]
        if got.shape != ref.shape:
            raise RuntimeError(f"ONNX output shape {got.shape} != PyTorch {ref.shape}")
        if not (np.isfinite(ref).all() and np.isfinite(got).all()):  # NaN "matches" NaN: never verify that
            raise ForesightError(f"the scorer gives NaN/Inf scores on random inputs (PyTorch: "
                                 f"{int((~np.isfinite(ref)).sum())}, ONNX: {int((~np.isfinite(got)).sum())}); "
                                 "it cannot be verified, nothing was exported")
        worst = max(worst, float(np.abs(got - ref).max()))
    if not worst <= atol:
        raise RuntimeError(f"ONNX export differs from PyTorch by {worst:.2e} > {atol:.0e}")
    return worst


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


def check_card_cache(records: list, config, where: str) -> None:
    """Refuse quoted ``learned`` records of a scorer moved to another cache (``--budget --interval``) that were not
    measured in that cache: its card would present the numbers of the cache it left as the new one's."""
    for r in records:
        if _is_learned(r) and (r.get("budget"), r.get("interval")) != (config.budget, config.interval):
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
            cfg = r.get("policy_config") if _is_learned(r) else None
            if not isinstance(cfg, dict) or cfg.get("selection") != "topk":
                continue
            ran = cfg.get(name, 0.0)
            if not isinstance(ran, (int, float)) or isinstance(ran, bool) or float(ran) != default:
                raise ForesightError(f"{where}: its record {r['policy']!r} ran top-k at {name} {ran!r}, and this "
                                     f"scorer's top-k default is {name} {default:g}; quote a run at {default:g}, or "
                                     f"export with {flag} {ran}")


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
            stamped = [{**r, "scorer_sha256": sha} if _is_learned(r) else r for r in fid[0]]
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


__all__ = ["export_onnx", "export_scorer", "find_fidelity", "model_card", "resolve_scorer_dir"]
