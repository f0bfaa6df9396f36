"""Distillation's data: the scorer's features and the oracle's targets at every event of the golden trajectory,
cached on disk per trace (docs/training.md, distillation).

:func:`collect_events` replays traces teacher-forced (:func:`foresight.replay`, chunks of ``W``) with the
``golden`` policy driving the evictions, so the cache evolves exactly as the oracle evicted, while a
:class:`~foresight.policies.recorder.FeatureRecorder` runs the scorer's own
:class:`~foresight.features.FeatureExtractor` (the one the ``learned`` policy uses) and records, at every event,
the candidates' features (L, Hkv, C, D) and their targets from the labels: foresight values α and the golden
evict set. The LLM is frozen.

:class:`FeatureCache` keeps one safetensors file per trace under a key of everything that defines the features
(model fingerprint, B, W, the recent-query window when it is not W, decay, dtype, format, the groups it holds). It
holds the scorer's feature groups (``feature_cache_groups: scorer``, the default: less to compute and to store) or
every group (``all``, in ``FEATURE_GROUPS`` order), of which any feature set is a column selection (groups are
computed independently, so the columns are the same either way), so that feature-set sweeps reuse one extraction.
Files are written in the packed layout
(:mod:`training.packed_events`: an entry's key and value columns once per trace, not once per event); a file of the
earlier dense layout is repacked in place, without a replay. With several ranks each rank extracts its share of the
traces.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch
from tqdm.auto import tqdm

from foresight.errors import ForesightError
from foresight.features import FeatureExtractor
from foresight.policies import make_policy
from foresight.policies.recorder import FeatureRecorder
from foresight.runtime import length_batches, replay
from golden.labels import TraceLabels, token_hash
from training.distributed import barrier
from training.event_files import (RecordedEvents, check_free_space, concat_events, events_bytes, read_events,
                                  repack_events, save_events, saved_metadata, stack_events)
from training.packed_events import ALL_GROUPS, PACKED_LAYOUT, recorded_groups

FEATURE_CACHE_FORMAT = "foresight-sl-features/2"  # /2: cumulative features cover every query
#: ``feature_cache_groups``: the groups the feature cache holds, the scorer's (its feature set) or every group
FEATURE_CACHE_GROUPS = ("scorer", "all")


def collect_events(model, sequences, trace_ids, labels: dict, extractor_factory, budget: int, interval: int,
                   feature_dtype: torch.dtype = torch.float16, batch_size: int = 1) -> list[RecordedEvents]:
    """Replay ``sequences`` along their golden trajectories and record features + targets at every event.

    ``labels`` maps trace id -> :class:`golden.labels.TraceLabels`; ``extractor_factory()`` returns a fresh
    :class:`~foresight.features.FeatureExtractor`.
    """
    out = []
    for s0 in range(0, len(sequences), batch_size):
        seqs, ids = sequences[s0 : s0 + batch_size], list(trace_ids[s0 : s0 + batch_size])
        rec: dict[tuple[int, int], dict[int, tuple]] = {}

        def on_event(view, feats, ids=ids, rec=rec):
            for b, tid in enumerate(ids):
                events = labels[tid].events
                if view.event >= len(events):
                    continue
                ev = events[view.event]
                cand = ev.candidates[view.layer_idx]
                pos = view.candidate_positions[b].cpu()
                if cand.shape != pos.shape or not torch.equal(cand.to(pos.dtype), pos):
                    raise ForesightError(f"trace {tid!r}: replayed cache does not match the golden labels at "
                                         f"event {view.event}, layer {view.layer_idx}")
                ev_mask = ev.evicted_mask(view.layer_idx)
                rec.setdefault((b, view.event), {})[view.layer_idx] = (
                    feats[b].detach().to("cpu", feature_dtype), ev.alpha[view.layer_idx].float(), ev_mask, pos.int()
                )

        golden = make_policy("golden", labels={t: labels[t] for t in ids})
        policy = FeatureRecorder(extractor=extractor_factory(), driver=golden, on_event=on_event)
        replay(model, [list(map(int, s)) for s in seqs], policy, budget, interval, trace_ids=ids, logits=False)
        num_layers = model.config.num_hidden_layers
        for b, tid in enumerate(ids):
            keys = sorted(k for k in rec if k[0] == b)
            if keys:
                out.append(stack_events(tid, [rec[k] for k in keys], num_layers))
    return out


def trace_identity(input_ids, labels: TraceLabels) -> str:
    """What a trace's cached events were computed from: its token ids, the oracle's evictions (the golden
    trajectory the replay followed) and its foresight values α (the targets stored beside the features). A trace
    regenerated under the same id, or relabelled differently (even with the same evictions: labels of another dtype
    or device), gets another identity, so its stale events are never reused."""
    h = hashlib.sha256(token_hash(input_ids).encode())
    for ev in labels.events:
        h.update(ev.evicted.to(torch.int64).contiguous().numpy().tobytes())
        h.update(ev.alpha.to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


class FeatureCache:
    """Per-trace event files of the feature groups ``groups`` (default every group) under ``root/<key>/`` (see the
    module docstring)."""

    def __init__(self, root: str | Path, fingerprint: dict, budget: int, interval: int, decay: float,
                 dtype: str, weights: dict | None = None, window: int | None = None, groups=ALL_GROUPS):
        self.budget, self.interval, self.decay, self.dtype = budget, interval, decay, dtype
        self.window = window or interval  # the extractor's recent-query window (a fine-tuned scorer keeps its own)
        self.groups = recorded_groups(groups)  # in FEATURE_GROUPS order, as packed files hold them
        self.head_dim = int(fingerprint["head_dim"])
        self.num_groups = int(fingerprint["num_heads"]) // int(fingerprint["num_kv_heads"])
        key = [fingerprint, budget, interval, list(self.groups), decay, dtype, FEATURE_CACHE_FORMAT]
        # the model's weights dtype (foresight.fingerprint.weights_dtype), only when not float32: features of bf16
        # weights were reused by a float32 run; caches made before it was keyed stay float32's
        # likewise the window, only when it is not W: every cache made before it was keyed is W's
        extra = ([weights] if weights else []) + ([{"window": self.window}] if self.window != interval else [])
        blob = json.dumps(key + extra, sort_keys=True)
        self.dir = Path(root) / hashlib.sha1(blob.encode()).hexdigest()[:16]

    def extractor(self, groups=None) -> FeatureExtractor:
        """A fresh extractor with this cache's window and decay: of the groups its files hold, or of ``groups``, those
        DAgger's rows record (:mod:`training.dagger`; the same columns, as groups are computed independently)."""
        return FeatureExtractor(window=self.window, feature_set=tuple(groups or self.groups), decay=self.decay)

    def file(self, trace_id: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", trace_id)
        digest = hashlib.sha1(trace_id.encode()).hexdigest()[:8]
        return self.dir / f"{safe}-{digest}.safetensors"

    def extract(self, model, rows: list[dict], labels: dict, dist, batch_size: int = 1) -> None:
        """Replay this rank's share of ``rows`` without an up-to-date file (none, or one computed from other
        tokens or other golden evictions: :func:`trace_identity`) and save their events; repack up-to-date files of
        the earlier dense layout (collective)."""
        ident = {r["trace_id"]: trace_identity(r["input_ids"], labels[r["trace_id"]]) for r in rows}
        meta = {t: saved_metadata(self.file(t)) for t in ident}
        stale = [r for r in rows if meta[r["trace_id"]].get("identity") != ident[r["trace_id"]]]
        barrier()  # every rank has read the files' state before any rank rewrites one: the shares below agree
        mine = [r["trace_id"] for r in rows[dist.rank :: dist.world_size]]
        dense = [t for t in mine if meta[t].get("identity") == ident[t] and meta[t].get("layout") != PACKED_LAYOUT]
        repack_events([self.file(t) for t in dense], FEATURE_CACHE_FORMAT, self.head_dim, self.num_groups,
                      "repack features", dist.is_main)
        check_free_space(self.dir, sum(events_bytes(labels[r["trace_id"]], self.head_dim, self.num_groups,
                                                    getattr(torch, self.dtype), self.groups) for r in stale),
                         f"the feature cache ({len(stale)} trace files)", "free disk space or point feature_cache "
                         "at a larger disk (files already extracted are kept)")
        todo = stale[dist.rank :: dist.world_size]
        bar = tqdm(total=len(todo), desc="features", unit="trace", disable=not (dist.is_main and todo),
                   dynamic_ncols=True)
        for batch in length_batches([len(r["input_ids"]) for r in todo], batch_size):
            part = [todo[i] for i in batch]
            events = collect_events(
                model, [r["input_ids"] for r in part], [r["trace_id"] for r in part], labels, self.extractor,
                self.budget, self.interval, getattr(torch, self.dtype), len(part))
            for ev in events:
                save_events(self.file(ev.trace_id), ev, self.head_dim, self.num_groups, FEATURE_CACHE_FORMAT,
                            {"identity": ident[ev.trace_id]}, self.groups)
            bar.update(len(part))
        bar.close()
        barrier()

    def load(self, rows: list[dict], columns: torch.Tensor, labels: dict) -> dict | None:
        """The events of ``rows`` (traces without events have no file) as one: features (of ``columns``), alpha,
        evicted and positions, each an :class:`~training.mapped_events.EventRows` read in place from the files
        (:func:`~training.event_files.concat_events`); None when there are none. A file computed from other tokens
        or labels is refused."""
        evs = []
        for r in rows:
            path = self.file(r["trace_id"])
            if not path.exists():
                continue
            meta, ev = read_events(path, FEATURE_CACHE_FORMAT)  # one read of the file's header
            if meta.get("identity") != trace_identity(r["input_ids"], labels[r["trace_id"]]):
                raise ForesightError(f"{path} holds features of another version of trace {r['trace_id']!r} "
                                     "(other tokens or golden evictions); rerun to extract them again")
            evs.append(ev)
        return concat_events(evs, columns)  # features read in place, per batch
