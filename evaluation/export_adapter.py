"""The adapter half of ``foresight export --adapter DIR`` (docs/training.md, adaptation).

The export directory gets ``adapter/``: the adapter in peft's own format (``adapter_config.json`` +
``adapter_model.safetensors``, loadable by ``PeftModel.from_pretrained(base, "<out>/adapter")`` and by any job's
``--adapter <out>/adapter``) plus ``foresight_adapter.json`` (the base fingerprint and the policy, B and W it was
trained under), and the model card gains a section saying so.

**Pairing with the scorer.** ``foresight train adapt`` under ``learned`` trains the adapter while that very scorer
(frozen) evicts, on the adapted model's keys, values and attention. When the exported scorer is that scorer (same
weights SHA-256 as recorded in ``foresight_adapter.json``), the scorer's fingerprint gains the adapter's identity,
so ``Scorer.from_pretrained(out, model=load_model(base, adapter=out/adapter))`` accepts the pair and the base model
alone is refused. Otherwise the scorer keeps its own fingerprint (it expects the model it was trained for) and the
card says that the two were not trained together. An adapter made for another base model than the scorer's is
refused (:func:`check_scorer_base`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from foresight.adapters import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, TRAINING_META, AdapterError, adapter_identity,
                                check_base, read_adapter_config, read_training_meta)
from foresight.config import read_json
from foresight.fingerprint import file_sha256
from foresight.scorer import WEIGHTS_NAME

ADAPTER_SUBDIR = "adapter"


def resolve_adapter_dir(path: str | Path) -> Path:
    """An adapter directory from ``path``: the directory itself or its ``adapter/`` (``train adapt`` output)."""
    path = Path(path)
    if (path / ADAPTER_SUBDIR / ADAPTER_CONFIG).is_file() and not (path / ADAPTER_CONFIG).is_file():
        path = path / ADAPTER_SUBDIR
    read_adapter_config(path)  # one line naming the directory when it is not an adapter
    return path


def check_scorer_base(adapter_dir: Path, scorer) -> None:
    """Refuse an adapter made for another base model than the scorer's (:func:`foresight.adapters.check_base`
    against the scorer's fingerprint without any adapter it records): the export would ship a pair no model
    runs together."""
    base = {k: v for k, v in scorer.config.fingerprint.items() if k != "adapter"}
    check_base(adapter_dir, base, fix=f"export the scorer {scorer.source or ''} without --adapter, or with an "
               "adapter of its base model")


def paired_with(adapter_dir: Path, scorer_dir: Path) -> bool:
    """True when the adapter was trained under ``learned`` with exactly this scorer's weights."""
    meta = read_training_meta(adapter_dir) or {}
    recorded = meta.get("scorer_sha256")
    return meta.get("policy") == "learned" and bool(recorded) and recorded == file_sha256(scorer_dir / WEIGHTS_NAME)


def bind_scorer(scorer, adapter_dir: Path) -> dict:
    """Record the adapter in the scorer's fingerprint and provenance (call only for a :func:`paired_with` pair);
    returns the adapter's identity."""
    identity = adapter_identity(adapter_dir)
    scorer.config.fingerprint = {**scorer.config.fingerprint, "adapter": identity}
    scorer.config.provenance = {**(scorer.config.provenance or {}),
                                "adapter": {"sha256": identity["sha256"], "note": "the scorer was trained on the "
                                            "base model; the adapter was then trained with it frozen, evicting"}}
    return identity


def write_adapter(adapter_dir: Path, dest: Path) -> None:
    """Copy the adapter's peft files and ``foresight_adapter.json`` to ``dest`` (peft's own README is not copied:
    the export's model card describes the adapter)."""
    dest.mkdir(parents=True)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, TRAINING_META):
        if (adapter_dir / name).is_file():
            shutil.copy2(adapter_dir / name, dest / name)
    if file_sha256(dest / ADAPTER_WEIGHTS) != file_sha256(adapter_dir / ADAPTER_WEIGHTS):
        raise AdapterError(f"adapter {adapter_dir}: the copy of {ADAPTER_WEIGHTS} differs from its source")


def _training_eval(adapter_dir: Path) -> tuple[dict, dict] | None:
    """(eval_before, eval) of the ``train adapt`` run the adapter came from (its ``summary.json``), if any."""
    summary = adapter_dir.parent / "summary.json"
    if not summary.is_file():
        return None
    try:
        data = read_json(summary, "training summary")
    except Exception:  # a damaged summary only costs the card its numbers
        return None
    after = data.get("eval") if isinstance(data.get("eval"), dict) else {}
    before = data.get("eval_before") if isinstance(data.get("eval_before"), dict) else {}
    return (before, after) if after else None


def _num(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) and v == v else ("n/a" if v is None or v != v else str(v))


def adapter_card(adapter_dir: Path, out: Path, paired: bool) -> list[str]:
    """The model card's adapter section: what it was trained under, how to load it, held-out numbers if known."""
    cfg = read_adapter_config(adapter_dir)
    meta = read_training_meta(adapter_dir) or {}
    ident = adapter_identity(adapter_dir)
    where = out / ADAPTER_SUBDIR
    base = (meta.get("base_fingerprint") or {}).get("model") or cfg.get("base_model_name_or_path") or "MODEL"
    lines = ["## Adapter (eviction-aware LoRA, docs/training.md, adaptation)", ""]
    if meta.get("policy"):
        lines.append(f"Trained by `foresight train adapt` under policy **{meta['policy']}** at budget "
                     f"**B = {meta.get('budget')}**, interval **W = {meta.get('interval')}**"
                     f"{', sinks ' + str(meta['sinks']) if meta.get('sinks') else ''}: the model with this adapter "
                     "and that eviction was distilled towards the same model without the adapter and with the full "
                     "cache (KL over positions >= B + W).")
    else:
        lines.append("An adapter not trained by `foresight train adapt` (no record of an eviction policy, B or W).")
    init = meta.get("init_adapter") if isinstance(meta.get("init_adapter"), dict) else None
    lines += ["", f"- base model: `{base}`; {ident['peft_type']} r = {ident['r']}, alpha = {ident['lora_alpha']}, "
              f"targets {', '.join(ident['target_modules'] or [])}",
              *([f"- training continued from the adapter `{init.get('path')}` (sha256 "
                 f"`{str(init.get('sha256'))[:16]}…`; `init_adapter`): \"before training\" below is that adapter"]
                if init else []),
              f"- files: `{ADAPTER_SUBDIR}/{ADAPTER_CONFIG}`, `{ADAPTER_SUBDIR}/{ADAPTER_WEIGHTS}` (sha256 "
              f"`{ident['sha256'][:16]}…`), `{ADAPTER_SUBDIR}/{TRAINING_META}`",
              "- " + ("this scorer is the one the adapter was trained with (frozen): its fingerprint records the "
                      "adapter, so load the model with it" if paired else
                      "this scorer was **not** the one the adapter was trained with; the scorer expects the model "
                      "named in its own fingerprint (use them separately)"),
              "", "```python", "import foresight", "from peft import PeftModel", "",
              f"model, tok = foresight.load_model({base!r}, adapter={str(where)!r})  # merged; fingerprint records it",
              f"# or, with peft alone: PeftModel.from_pretrained(base_model, {str(where)!r})", "```", "",
              f"CLI: any job takes `--adapter {where}`.", ""]
    evals = _training_eval(adapter_dir)
    if evals:
        before, after = evals
        keys = [k for k in after if k.startswith("heldout_") and isinstance(after[k], (int, float))]
        lines += ["Held-out evaluation of the training run (`summary.json`; `*_base`: adapter disabled):", "",
                  "| metric | before training | after |", "|---|---:|---:|"]
        lines += [f"| {k} | {_num(before.get(k))} | {_num(after[k])} |" for k in keys]
        lines.append("")
    return lines


def adapter_summary(adapter_dir: Path) -> dict:
    """Policy, B, W and identity of the adapter, for the export's return value."""
    meta = read_training_meta(adapter_dir) or {}
    return {"policy": meta.get("policy"), "budget": meta.get("budget"), "interval": meta.get("interval"),
            "sha256": adapter_identity(adapter_dir)["sha256"]}


__all__ = ["ADAPTER_SUBDIR", "adapter_card", "adapter_summary", "bind_scorer", "check_scorer_base", "paired_with",
           "resolve_adapter_dir", "write_adapter"]
