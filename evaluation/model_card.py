"""The model card (``README.md``) of an exported scorer: Hub metadata, use, details, provenance, fidelity."""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.onnx_export import ONNX_NAME
from foresight.fingerprint import file_sha256
from foresight.scorer import TOPK_DEFAULTS, WEIGHTS_NAME
from foresight.scorer_hub import card_data, card_header


def _provenance_value(v) -> str:
    """A provenance value for the card: long lists (trace ids) as their length, the whole list in config.json."""
    if isinstance(v, list) and len(v) > 8:
        return f"{len(v)} entries (listed in `config.json`)"
    return f"`{json.dumps(v, default=str) if not isinstance(v, str) else v}`"


def _provenance_lines(key: str, v, depth: int = 0) -> list[str]:
    """The card's bullet of provenance entry ``key``: a record (a training stage's, its config) or a list of records
    (``earlier_stages``) as nested bullets, anything else on one line by :func:`_provenance_value`."""
    pad = "  " * depth
    if isinstance(v, dict) and v:
        items = list(v.items())
    elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        items = [(str(i), x) for i, x in enumerate(v, 1)]
    else:
        return [f"{pad}- {key}: {_provenance_value(v)}"]
    return [f"{pad}- {key}:"] + [line for k, x in items for line in _provenance_lines(k, x, depth + 1)]


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
        lines += [line for k, v in prov.items() for line in _provenance_lines(k, v)]
    else:
        lines.append("- (the checkpoint records no provenance)")
    lines.append("")
    if fidelity:
        lines += _fidelity_section(fidelity[0], fidelity[1], cfg)
    else:
        lines += ["## Evaluation", "", "No fidelity results were found next to the checkpoint; run "
                  "`foresight eval fidelity` and re-export with `--fidelity`.", ""]
    return "\n".join(lines)


__all__ = ["model_card"]
