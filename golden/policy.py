"""Golden Eviction replay: evict exactly what the oracle's labels say (the upper reference, replay only).

ForesightKV's Golden Eviction oracle (docs/oracle.md); labels come from ``foresight golden``
(:mod:`golden.oracle`). Replaying them gives the golden loss ratio that learned policies chase.

The policy reads labels, so it lives with them above the library: it is registered under the name ``golden`` as a
``foresight.policies`` entry point (``pyproject.toml``; :mod:`foresight.plugins`), so the library's policy registry
imports it on first use and never imports upward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from foresight.errors import ForesightError
from foresight.fingerprint import check_same_model
from foresight.policies.base import EvictionPolicy
from golden.labels import LabelMismatchError, TraceLabels, check_label_tokens, labels_digest, load_labels


@dataclass
class GoldenPolicy(EvictionPolicy):
    """Replay Golden Eviction labels: evict the labelled positions; other candidates score their α.

    Parameters
    ----------
    labels
        ``{trace_id: TraceLabels}``, a list of ``TraceLabels``, or a path accepted by
        :func:`golden.labels.load_labels`. Pass the batch's ``trace_ids=[...]`` to
        :func:`foresight.replay`; rows past the end of their trace's events (padding) fall back to recency.
    """

    name = "golden"
    replay_only = True
    per_layer = True
    labels: Any = None
    _by_id: dict = field(default_factory=dict, init=False, repr=False)
    _digest: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        labels = self.labels
        if labels is None:
            raise ValueError("the golden policy needs labels=<dict, list of TraceLabels or path>")
        if isinstance(labels, (str, Path)):
            labels = load_labels(labels)
        if isinstance(labels, TraceLabels):
            labels = [labels]
        if not isinstance(labels, dict):
            labels = {lab.trace_id: lab for lab in labels}
        if not labels:
            raise ValueError("the golden policy got no labels")
        self._by_id = labels
        self._settings = {(lab.budget, lab.interval) for lab in labels.values()}

    def config(self) -> dict:
        return {"labels": f"<{len(self._by_id)} traces>"}

    def content_digest(self) -> str:
        """What identifies the labels beyond ``config()`` (:func:`golden.labels.labels_digest`): a resumable
        evaluation keys its journal on it, so labels re-made for the same traces are never mixed in."""
        if self._digest is None:
            self._digest = labels_digest(self._by_id)
        return self._digest

    def check_cache(self, budget, interval):
        if {(budget, interval)} != self._settings:
            have = ", ".join(f"B={b} W={w}" for b, w in sorted(self._settings))
            raise LabelMismatchError(f"golden labels were made for {have}; this replay uses B={budget} W={interval}")

    def check_traces(self, trace_ids, sequences=None, fingerprint=None) -> None:
        """Raise unless every trace has labels, computed from exactly its token ids (``sequences``, by token
        hash) and with the model of ``fingerprint``; callers may run it up front to fail before any compute."""
        trace_ids = list(trace_ids)
        seqs = list(sequences) if sequences is not None else [None] * len(trace_ids)
        # `foresight golden` labels no trace of at most B + W tokens (no event fires before it ends)
        no_event = min(b + w for b, w in self._settings)
        missing = [t for t, seq in zip(trace_ids, seqs)
                   if t not in self._by_id and (seq is None or len(seq) > no_event)]
        if missing:
            where = sorted({lab.source for lab in self._by_id.values() if lab.source}) or ["(in memory)"]
            raise ForesightError(f"no golden labels for trace(s) {', '.join(map(str, missing[:5]))} in "
                                 f"{', '.join(where[:3])}{' ...' if len(where) > 3 else ''}")
        if sequences is not None:
            check_label_tokens(self._by_id, zip(trace_ids, sequences))
        if fingerprint is not None:
            for t in dict.fromkeys(t for t in trace_ids if t in self._by_id):
                lab = self._by_id[t]
                check_same_model(lab.fingerprint, fingerprint, f"golden labels {lab.source or '(in memory)'} of "
                                 f"trace {t!r}", fix="label the traces with this model (`foresight golden`)",
                                 error=LabelMismatchError)

    def reset(self, batch_size, num_layers, device, trace_ids=None, token_ids=None, fingerprint=None, **meta):
        """``trace_ids`` pick the labels; ``token_ids`` (the rows' tokens) and ``fingerprint`` (the model's),
        passed by :func:`foresight.replay`, are checked against what the labels were made from."""
        if trace_ids is None:
            raise ForesightError("the golden policy replays labels: pass trace_ids=[...] (one per row) to replay")
        trace_ids = list(trace_ids)
        if len(trace_ids) != batch_size:
            raise ForesightError(f"got {len(trace_ids)} trace_ids for a batch of {batch_size}")
        self.check_traces(trace_ids, token_ids, fingerprint)
        self._rows = [self._by_id.get(t) for t in trace_ids]  # None: a trace too short for any event

    def score(self, view):
        cand_pos = view.candidate_positions  # (batch, Hkv, C)
        scores = cand_pos.float().clone()  # recency fallback for rows whose trace has ended
        for b, lab in enumerate(self._rows):
            if lab is None or view.event >= len(lab.events):
                continue
            ev = lab.events[view.event]
            cand = ev.candidates[view.layer_idx].to(cand_pos.device)
            if cand.shape != cand_pos[b].shape or not torch.equal(cand, cand_pos[b]):
                raise ForesightError(
                    f"golden labels of trace {lab.trace_id!r} do not match the replayed cache at event "
                    f"{view.event} (layer {view.layer_idx}); were they made from this exact trace with this B/W?"
                )
            evicted = ev.evicted[view.layer_idx].to(cand_pos.device)  # (Hkv, E)
            is_evicted = (cand[..., :, None] == evicted[..., None, :]).any(-1)
            row = ev.alpha[view.layer_idx].to(cand_pos.device, torch.float32)
            scores[b] = row.masked_fill(is_evicted, float("-inf"))
        return scores
