"""Golden Eviction labels: data classes, safetensors shard writer/reader and compatibility checks.

One shard file (``labels-NNNNN.safetensors``) holds the labels of a few traces. Per trace ``t`` with ``E``
events it stores ``t/ends`` (E,), ``t/candidates`` (E, L, Hkv, B) and ``t/evicted`` (E, L, Hkv, W) as int32
logical positions, and ``t/alpha`` (E, L, Hkv, B) fp32 foresight values; the header metadata records the
format, the model fingerprint, B, W, the trace ids and, per trace, the :func:`token_hash` of the token ids
the labels were computed from. Every event of the runtime's schedule fires at ``B + W`` entries, so there are
always ``B`` candidates and ``W`` evictions.

Format /3 adds ``t/foresight`` (L, Hkv, end_0 + ... + end_{E-1}) fp32: the oracle's foresight value
α(i, s) = max over blocks j > s of ā[i, j] of *every* position ``i`` already appended at every event (0 when no
block remains), event ``e``'s ``end_e`` values packed after those of the earlier events, so on-policy relabelling
(DAgger, :mod:`training.dagger`) can label candidates that golden's own cache never held
(:meth:`TraceLabels.alpha_at`). It is one column of the suffix maxima of ā per event, cut at the event: at most
N / W columns of at most N values, O(N · N/W) per (layer, KV head) like ā itself. It is read lazily (only
DAgger needs it; loading labels for replay or distillation does not hold it in memory). Files of format /2 lack
it but are otherwise complete: they stay readable for golden replay and distillation, and DAgger refuses them
with a request to regenerate.

Labels are looked up by trace id, and an id says nothing about the tokens: labels of other token sequences
under the same ids replay without complaint and give a meaningless golden loss ratio. So everything that
combines labels with traces checks the hash (:func:`check_label_tokens`; the golden policy does it at every
replay), and files of the first format, which have no hashes, are refused with a request to regenerate.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import torch
from safetensors import SafetensorError, safe_open

from foresight.errors import ForesightError
from foresight.fingerprint import check_same_model
from foresight.models import model_fingerprint
from foresight.safetensors_file import save_safetensors
from golden.sharding import check_shard, read_plan, recorded_digest, shard_path

FORMAT = "foresight-golden-labels/3"
#: Readable formats without the per-position foresight values (DAgger refuses them, nothing else needs them).
NO_FORESIGHT_FORMATS = ("foresight-golden-labels/2",)
#: Earlier formats: readable in principle, but without token hashes, so refused (never trusted silently).
OLD_FORMATS = ("foresight-golden-labels/1",)


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

    def evicted_mask(self, layer: int | None = None) -> torch.Tensor:
        """Bool mask over ``candidates`` ((L, Hkv, C), or (Hkv, C) of one ``layer``) of the entries the oracle
        evicts."""
        cand, ev = (self.candidates, self.evicted) if layer is None else (self.candidates[layer], self.evicted[layer])
        return (cand[..., :, None] == ev[..., None, :]).any(-1)


@dataclass
class TraceLabels:
    """All events of one trace with the settings they were made for."""

    trace_id: str
    budget: int
    interval: int
    fingerprint: dict
    events: list[EventLabel] = field(default_factory=list)
    token_hash: str | None = None  # token_hash() of the trace the labels were computed from
    source: str | None = None  # the file the labels were read from (for messages)
    #: (L, Hkv, sum of event ends) fp32 α(i, s_e) of every appended position at every event, packed (module
    #: docstring); read on first use from ``foresight_file`` when the labels came from a /3 file
    foresight: torch.Tensor | None = None
    foresight_file: str | None = None
    #: what the oracle averaged over future queries (``golden.oracle.MEASURES``); files record it when it is not
    #: the method's attention, so that labels of two oracles are never merged or trained on together unnoticed
    measure: str = "attention"

    def load_foresight(self) -> torch.Tensor:
        """The packed foresight values (read from ``foresight_file`` on first use)."""
        if self.foresight is None and self.foresight_file:
            try:
                with safe_open(self.foresight_file, framework="pt") as f:
                    self.foresight = f.get_tensor(f"{self.trace_id}/foresight")
            except (SafetensorError, OSError) as exc:
                raise ForesightError(f"{self.foresight_file} is not a readable golden label file "
                                     f"({' '.join(str(exc).split())}); redo it with `foresight golden`") from None
        if self.foresight is None:
            raise LabelMismatchError(
                f"golden labels {self.source or '(in memory)'} of trace {self.trace_id!r} hold no per-position "
                f"foresight values (made before format {FORMAT}); regenerate them with `foresight golden` into a "
                "new directory to use on-policy relabelling (dagger_rounds > 0)")
        return self.foresight

    def release_foresight(self) -> None:
        """Drop the foresight values from memory when they can be read again from ``foresight_file``."""
        if self.foresight_file:
            self.foresight = None

    def alpha_at(self, event: int, layer: int, positions: torch.Tensor) -> torch.Tensor:
        """The oracle's foresight values (Hkv, C) at ``event`` of ``layer`` for any (Hkv, C) logical
        ``positions`` already appended at that event (candidates of whatever cache a policy produced)."""
        packed = self.load_foresight()
        start = sum(ev.end for ev in self.events[:event])
        pos = positions.long().cpu()
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= self.events[event].end):
            raise ValueError(f"positions outside [0, {self.events[event].end}) at event {event}")
        return packed[layer].gather(-1, pos + start)


def token_hash(input_ids) -> str:
    """SHA-256 (hex) of a trace's token ids as little-endian int64: ties labels to the exact token sequence."""
    ids = torch.as_tensor(input_ids).reshape(-1).to(torch.int64).cpu().numpy().astype("<i8", copy=False)
    return hashlib.sha256(ids.tobytes()).hexdigest()


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
        **({} if label.foresight is None and not label.foresight_file
           else {f"{t}/foresight": label.load_foresight().float().contiguous()}),
    }


def save_labels(path: str | Path, labels: Iterable[TraceLabels]) -> Path:
    """Write labels (same fingerprint, B and W) to one safetensors file; returns ``path``."""
    labels = list(labels)
    if not labels:
        raise ValueError("no labels to save")
    first = labels[0]
    tensors = {}
    for lab in labels:
        if ((lab.budget, lab.interval, lab.fingerprint, lab.measure)
                != (first.budget, first.interval, first.fingerprint, first.measure)):
            raise ValueError("all labels in one file must share fingerprint, budget, interval and measure")
        if not lab.token_hash:
            raise ValueError(f"labels of trace {lab.trace_id!r} have no token_hash (make them with "
                             "golden.oracle.label_trace, which records it)")
        tensors.update(_stack(lab))
    meta = {
        "format": FORMAT,
        "fingerprint": json.dumps(first.fingerprint, sort_keys=True),
        "budget": str(first.budget),
        "interval": str(first.interval),
        "trace_ids": json.dumps([lab.trace_id for lab in labels]),
        "token_hashes": json.dumps({lab.trace_id: lab.token_hash for lab in labels}, sort_keys=True),
        **({} if first.measure == "attention" else {"measure": first.measure}),  # absent: files before it, same bytes
    }
    return save_safetensors(tensors, path, meta)  # the header's keys sorted: identical runs give identical bytes


def read_label_file(path: str | Path) -> dict[str, TraceLabels]:
    """Read one safetensors label file into ``{trace_id: TraceLabels}`` (file order); a truncated or damaged
    file raises :class:`ForesightError` naming it."""
    try:
        return _read_label_file(path)
    except ForesightError:
        raise
    except (SafetensorError, OSError, KeyError, ValueError, TypeError) as exc:
        raise ForesightError(f"{path} is not a readable golden label file ({' '.join(str(exc).split())}); "
                             "redo it with `foresight golden`") from None


def _read_label_file(path: str | Path) -> dict[str, TraceLabels]:
    out = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") in OLD_FORMATS:
            raise LabelMismatchError(
                f"{path} holds golden labels without token hashes ({meta['format']}), so they cannot be checked "
                "against the traces they are used with; regenerate them with `foresight golden` into a new "
                "directory (or delete the old one first)"
            )
        if meta.get("format") not in (FORMAT, *NO_FORESIGHT_FORMATS):
            raise ForesightError(f"{path} is not a golden label file (format {meta.get('format')!r})")
        names = set(f.keys())
        fp, budget, interval = json.loads(meta["fingerprint"]), int(meta["budget"]), int(meta["interval"])
        measure = meta.get("measure", "attention")
        hashes = json.loads(meta.get("token_hashes", "{}"))
        for tid in json.loads(meta["trace_ids"]):
            if not hashes.get(tid):
                raise LabelMismatchError(f"{path} has no token hash for trace {tid!r}; regenerate the labels "
                                         "with `foresight golden`")
            ends = f.get_tensor(f"{tid}/ends").tolist()
            cand = f.get_tensor(f"{tid}/candidates").long()
            alpha = f.get_tensor(f"{tid}/alpha")
            evicted = f.get_tensor(f"{tid}/evicted").long()
            events = [EventLabel(int(e), cand[k], alpha[k], evicted[k]) for k, e in enumerate(ends)]
            lazy = str(path) if f"{tid}/foresight" in names else None
            out[tid] = TraceLabels(tid, budget, interval, fp, events, hashes[tid], str(path), foresight_file=lazy,
                                   measure=measure)
    return out


def load_labels(path: str | Path, complete: bool = False) -> dict[str, TraceLabels]:
    """Load golden labels: a ``foresight golden`` output directory (finished shards, plan order) or one file.

    ``complete`` refuses a directory whose plan still has unfinished shards (a labelling run still going, or
    killed): a trainer would otherwise learn from the traces labelled so far without a word."""
    path = Path(path)
    if path.is_file():
        return read_label_file(path)
    if not path.is_dir():
        raise ForesightError(f"label path not found: {path}")
    plan = read_plan(path)
    if plan is None or plan.get("kind") != "foresight-golden":
        raise ForesightError(f"{path} is not a `foresight golden` output directory (no golden plan.json)")
    out: dict[str, TraceLabels] = {}
    unfinished = 0
    for unit in plan["units"]:
        if check_shard(path, unit["shard"], "rerun the same `foresight golden` command to redo it"):
            out.update(read_label_file(shard_path(path, unit["shard"])))
        else:
            unfinished += 1
    if not out:
        raise ForesightError(f"{path} has no finished label shards yet")
    if complete and unfinished:
        raise ForesightError(f"{path}: {unfinished} of {len(plan['units'])} label shards are not finished (`foresight "
                             "golden` still running, or stopped); let it finish, or rerun the same command, first")
    return out


def merge_labels(sets: Iterable[tuple[str | Path, Mapping[str, TraceLabels]]]) -> dict[str, TraceLabels]:
    """The labels of several ``(source, labels)`` sets as one. Raises :class:`ForesightError` naming both sources
    when a trace is labelled in two of them (one would silently replace the other), and
    :class:`LabelMismatchError` naming both when they were made by oracles of different measures (one target
    would pass for the other)."""
    out: dict[str, TraceLabels] = {}
    source: dict[str, str | Path] = {}
    for where, labels in sets:
        for t, lab in labels.items():
            if t in out:
                raise ForesightError(f"trace {t!r} is labelled in both {source[t]} and {where}; give each trace's "
                                     "labels once")
            first = next(iter(out.values()), None)
            if first is not None and first.measure != lab.measure:
                raise LabelMismatchError(
                    f"golden labels {source[first.trace_id]} (measure {first.measure}) and {where} (measure "
                    f"{lab.measure}) were made by different oracles; label every set with the same "
                    "`foresight golden --measure`")
            out[t], source[t] = lab, where
    return out


def check_labels_match(
    labels: TraceLabels | Mapping[str, TraceLabels] | Iterable[TraceLabels], model, budget: int, interval: int
) -> None:
    """Raise :class:`LabelMismatchError` unless every label was made for ``model`` at this B and W."""
    fp = model if isinstance(model, dict) else model_fingerprint(model)
    for lab in _as_list(labels):
        check_same_model(lab.fingerprint, fp, f"golden labels {lab.source or '(in memory)'} of trace "
                         f"{lab.trace_id!r}", fix="label the traces with this model (`foresight golden`)",
                         error=LabelMismatchError)
        check_labels_budget([lab], budget, interval)


def check_labels_budget(labels: TraceLabels | Mapping[str, TraceLabels] | Iterable[TraceLabels], budget: int,
                        interval: int) -> None:
    """Raise :class:`LabelMismatchError` unless every label was made at this B and W (needs no model: a check to make
    before loading one)."""
    for lab in _as_list(labels):
        if (lab.budget, lab.interval) != (budget, interval):
            raise LabelMismatchError(
                f"golden labels {lab.source or '(in memory)'} of trace {lab.trace_id!r} were made for "
                f"B={lab.budget}, W={lab.interval}, not B={budget}, W={interval}; run `foresight golden` with "
                "these values"
            )


def check_label_tokens(labels: Mapping[str, TraceLabels], traces: Iterable[tuple[str, object]]) -> None:
    """Raise :class:`LabelMismatchError` unless each ``(trace_id, input_ids)`` with labels has the token ids
    its labels were computed from (traces without labels are not checked here)."""
    for tid, ids in traces:
        lab = labels.get(tid)
        if lab is None:
            continue
        where = lab.source or "(in memory)"
        if not lab.token_hash:
            raise LabelMismatchError(f"golden labels {where} of trace {tid!r} record no token hash, so they cannot "
                                     "be checked against the trace; regenerate them with `foresight golden`")
        got = token_hash(ids)
        if got != lab.token_hash:
            raise LabelMismatchError(
                f"golden labels {where} of trace {tid!r} were computed from other token ids than this trace "
                f"(token hash {lab.token_hash[:12]}… vs {got[:12]}…): the labels belong to other traces with the "
                "same ids; label these traces with `foresight golden`"
            )


def labels_digest(labels: Mapping[str, TraceLabels]) -> str:
    """SHA-256 identifying a set of labels by content, so that labels re-made for the same traces (another model
    or adapter, other settings) never pass for these: per trace (in id order) its id, B, W, fingerprint, token
    hash and the digest of its events. A trace read from a ``foresight golden`` shard takes its shard's recorded
    digest (:func:`golden.sharding.recorded_digest`: nothing is read again); others hash their event tensors."""
    h, shards = hashlib.sha256(), {}
    for tid in sorted(labels):
        lab = labels[tid]
        if lab.source and lab.source not in shards:
            shards[lab.source] = recorded_digest(lab.source)
        content = (lab.source and shards[lab.source]) or _events_digest(lab)
        h.update(json.dumps([tid, lab.budget, lab.interval, lab.fingerprint, lab.token_hash, content],
                            sort_keys=True, default=str).encode())
    return h.hexdigest()


def _events_digest(label: TraceLabels) -> str:
    h = hashlib.sha256()
    for ev in label.events:
        h.update(str(int(ev.end)).encode())
        for t in (ev.candidates, ev.alpha, ev.evicted):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    return h.hexdigest()


def _as_list(labels) -> list[TraceLabels]:
    if isinstance(labels, TraceLabels):
        return [labels]
    if isinstance(labels, Mapping):
        return list(labels.values())
    return list(labels)
