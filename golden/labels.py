"""Golden Eviction labels: data classes, safetensors shard writer/reader and compatibility checks.

One shard file (``labels-NNNNN.safetensors``) holds the labels of a few traces. Per trace ``t`` with ``E``
events it stores ``t/ends`` (E,), ``t/candidates`` (E, L, Hkv, B) and ``t/evicted`` (E, L, Hkv, W) as int32
logical positions, and ``t/alpha`` (E, L, Hkv, B) fp32 foresight values; the header metadata records the
format, the model fingerprint, B, W and the trace ids. Every event of the runtime's schedule fires at
``B + W`` entries, so there are always ``B`` candidates and ``W`` evictions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import torch

from foresight.errors import ForesightError

FORMAT = "foresight-golden-labels/1"


class LabelMismatchError(ForesightError, ValueError):
    """Labels used with a model, budget or interval other than the ones they were made for."""


@dataclass
class EventLabel:
    """The oracle's decision at one eviction event.

    Attributes
    ----------
    end
        Tokens appended when the event fired.
    candidates
        (L, Hkv, C) logical positions of the candidates, in cache order (ascending).
    alpha
        (L, Hkv, C) foresight values: max future block-averaged attention of each candidate.
    evicted
        (L, Hkv, E) logical positions the oracle evicts (ascending).
    """

    end: int
    candidates: torch.Tensor
    alpha: torch.Tensor
    evicted: torch.Tensor


@dataclass
class TraceLabels:
    """All events of one trace with the settings they were made for."""

    trace_id: str
    budget: int
    interval: int
    fingerprint: dict
    events: list[EventLabel] = field(default_factory=list)


def _stack(label: TraceLabels) -> dict[str, torch.Tensor]:
    ev = label.events
    t = label.trace_id
    if not ev:
        raise ValueError(f"trace {t!r} has no events to store")
    return {
        f"{t}/ends": torch.tensor([e.end for e in ev], dtype=torch.int64),
        f"{t}/candidates": torch.stack([e.candidates for e in ev]).to(torch.int32).contiguous(),
        f"{t}/alpha": torch.stack([e.alpha for e in ev]).float().contiguous(),
        f"{t}/evicted": torch.stack([e.evicted for e in ev]).to(torch.int32).contiguous(),
    }


def save_labels(path: str | Path, labels: Iterable[TraceLabels]) -> Path:
    """Write labels (same fingerprint, B and W) to one safetensors file; returns ``path``."""
    from safetensors.torch import save_file

    labels = list(labels)
    if not labels:
        raise ValueError("no labels to save")
    first = labels[0]
    tensors = {}
    for lab in labels:
        if (lab.budget, lab.interval, lab.fingerprint) != (first.budget, first.interval, first.fingerprint):
            raise ValueError("all labels in one file must share fingerprint, budget and interval")
        tensors.update(_stack(lab))
    meta = {
        "format": FORMAT,
        "fingerprint": json.dumps(first.fingerprint, sort_keys=True),
        "budget": str(first.budget),
        "interval": str(first.interval),
        "trace_ids": json.dumps([lab.trace_id for lab in labels]),
    }
    save_file(tensors, str(path), metadata=meta)
    return Path(path)


def read_label_file(path: str | Path) -> dict[str, TraceLabels]:
    """Read one safetensors label file into ``{trace_id: TraceLabels}`` (file order); a truncated or damaged
    file raises :class:`ForesightError` naming it."""
    from safetensors import SafetensorError

    try:
        return _read_label_file(path)
    except ForesightError:
        raise
    except (SafetensorError, OSError, KeyError, ValueError, TypeError) as exc:
        raise ForesightError(f"{path} is not a readable golden label file ({' '.join(str(exc).split())}); "
                             "redo it with `foresight golden`") from None


def _read_label_file(path: str | Path) -> dict[str, TraceLabels]:
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ForesightError(f"{path} is not a golden label file (format {meta.get('format')!r})")
        fp, budget, interval = json.loads(meta["fingerprint"]), int(meta["budget"]), int(meta["interval"])
        for tid in json.loads(meta["trace_ids"]):
            ends = f.get_tensor(f"{tid}/ends").tolist()
            cand = f.get_tensor(f"{tid}/candidates").long()
            alpha = f.get_tensor(f"{tid}/alpha")
            evicted = f.get_tensor(f"{tid}/evicted").long()
            events = [EventLabel(int(e), cand[k], alpha[k], evicted[k]) for k, e in enumerate(ends)]
            out[tid] = TraceLabels(tid, budget, interval, fp, events)
    return out


def load_labels(path: str | Path) -> dict[str, TraceLabels]:
    """Load golden labels: a ``foresight golden`` output directory (finished shards, plan order) or one file."""
    from golden.sharding import check_shard, read_plan, shard_path

    path = Path(path)
    if path.is_file():
        return read_label_file(path)
    if not path.is_dir():
        raise ForesightError(f"label path not found: {path}")
    plan = read_plan(path)
    if plan is None or plan.get("kind") != "foresight-golden":
        raise ForesightError(f"{path} is not a `foresight golden` output directory (no golden plan.json)")
    out: dict[str, TraceLabels] = {}
    for unit in plan["units"]:
        if check_shard(path, unit["shard"], "rerun the same `foresight golden` command to redo it"):
            out.update(read_label_file(shard_path(path, unit["shard"])))
    if not out:
        raise ForesightError(f"{path} has no finished label shards yet")
    return out


def check_labels_match(
    labels: TraceLabels | Mapping[str, TraceLabels] | Iterable[TraceLabels], model, budget: int, interval: int
) -> None:
    """Raise :class:`LabelMismatchError` unless every label was made for ``model`` at this B and W."""
    from foresight.models import model_fingerprint

    if isinstance(labels, TraceLabels):
        labels = [labels]
    elif isinstance(labels, Mapping):
        labels = list(labels.values())
    fp = model_fingerprint(model)
    for lab in labels:
        if lab.fingerprint != fp:
            diff = sorted(k for k in set(fp) | set(lab.fingerprint) if fp.get(k) != lab.fingerprint.get(k))
            raise LabelMismatchError(
                f"labels for trace {lab.trace_id!r} were made with model {lab.fingerprint.get('model')!r}, not "
                f"{fp.get('model')!r} (differs in {', '.join(diff)}); label the traces with this model"
            )
        if (lab.budget, lab.interval) != (budget, interval):
            raise LabelMismatchError(
                f"labels for trace {lab.trace_id!r} were made for B={lab.budget}, W={lab.interval}, "
                f"not B={budget}, W={interval}; run `foresight golden` with these values"
            )
