"""What one DAgger round records: the mixture policy π_r and the rows it produces (docs/training.md, DAgger).

:class:`MixturePolicy` drives a replay: at each event either the oracle acts on *this* cache (the W candidates with
the lowest foresight value α, ties older first: golden's own rule, so β = 1 replays the golden trajectory) or the
scorer acts: its top-k, or with ``temperature > 0`` its Plackett–Luce draw at that temperature
(:func:`foresight.sampling.sample_eviction`, the ``learned`` policy's ``selection=sample``), so a round can follow
the trajectory of the selection the scorer is deployed with; :func:`expert_events` draws which acts, seeded. At
every event it hands the candidates the cache holds, their features (one
:class:`~foresight.features.FeatureExtractor` of the groups the round records, of which the scorer reads its own
columns: the features the ``learned`` policy builds) and their α
(:meth:`golden.labels.TraceLabels.alpha_at`) to :func:`collect_onpolicy_events`, which stacks them per trace into
:class:`~training.event_files.RecordedEvents` (the feature cache's type; saved as :data:`ROWS_FORMAT` files by
:func:`~training.event_files.save_events`). The round logic (aggregation, retraining, resume) is
:mod:`training.dagger`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from foresight.errors import ForesightError
from foresight.policies.base import EvictionPolicy
from foresight.policies.learned import LearnedPolicy
from foresight.runtime import replay
from foresight.sampling import kept_indices, sample_eviction
from training.event_files import RecordedEvents, stack_events

ROWS_FORMAT = "foresight-dagger-rows/1"  # the layout (dense or packed) is recorded beside it


def trace_generator(seed: int, round_idx: int, trace_id: str, stream: str = "") -> torch.Generator:
    """A CPU generator seeded by (seed, round, trace, stream) alone, so batching, ranks and resumes do not change
    its draws."""
    key = hashlib.sha256(f"{seed}\x00{round_idx}\x00{trace_id}{stream}".encode()).hexdigest()
    return torch.Generator().manual_seed(int(key[:15], 16))


def expert_events(seed: int, round_idx: int, trace_id: str, num_events: int, beta: float) -> torch.Tensor:
    """(num_events,) bool: at which events of a trace the oracle acts in round ``round_idx`` (probability
    ``beta`` each); a pure function of its arguments."""
    return torch.rand(num_events, generator=trace_generator(seed, round_idx, trace_id)) < beta


def draw_generators(seed: int, round_idx: int, trace_id: str, num_layers: int) -> list[torch.Generator]:
    """The generators of the scorer's sampled evictions in one trace's replay of round ``round_idx``, one per layer
    (so layer-major and piecewise replay draw alike, :func:`foresight.sampling.layer_generators`; a stream of their
    own: the expert coins are the same with and without sampling)."""
    return [trace_generator(seed, round_idx, trace_id, f"\x00draw\x00{layer}") for layer in range(num_layers)]


def oracle_keep_scores(alpha: torch.Tensor) -> torch.Tensor:
    """Keep scores (..., C) that rank candidates as the greedy oracle does: ascending α, ties older first (the
    candidates are in cache order, which is ascending position). All distinct, so a top-k is unambiguous."""
    order = torch.sort(alpha, dim=-1, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(alpha.shape[-1], device=alpha.device).expand_as(order))
    return ranks.float()


RowHook = Callable[[int, Any, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass
class MixturePolicy(EvictionPolicy):
    """π_r: per event the oracle (where ``expert[trace][event]``) or the scorer, over one extractor.

    Not registered (it needs live objects). ``extractor`` computes the recorded feature groups once per event; the
    scorer reads its ``columns`` of them (the configured feature set), exactly the features the ``learned`` policy
    builds.
    The scorer acts as the ``learned`` policy deploys it (a :class:`~foresight.policies.learned.LearnedPolicy` of
    the same scorer, built here, ranks and keeps for it): with ``temperature`` 0 its ``selection=topk`` with the
    defaults the scorer records (newcomer bonus, age prior, spread: none for a freshly distilled scorer, so plain
    top-k), with ``temperature`` > 0 a Plackett–Luce draw of the evicted set at that temperature from each trace's own
    :func:`draw_generators` (``seed``, ``round_idx``, one per layer). ``on_row(b, view, features, alpha, evicted)``
    receives each row's candidates before eviction: features (Hkv, C, D), the oracle's α and its evict set for this
    cache (Hkv, C).
    """

    name: ClassVar[str] = "dagger_mixture"
    observes: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True
    extractor: Any = None
    scorer: Any = None
    columns: torch.Tensor | None = None
    labels: dict | None = None
    expert: dict | None = None
    on_row: RowHook | None = None
    temperature: float = 0.0
    seed: int = 0
    round_idx: int = 0
    _actor: Any = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.scorer is not None:  # top-k with the scorer's recorded defaults, or the draw at temperature
            self._actor = LearnedPolicy(scorer=self.scorer, any_budget=True,
                                        selection="sample" if self.temperature else "topk",
                                        temperature=self.temperature or None)

    def reset(self, batch_size, num_layers, device, num_groups: int = 1, trace_ids=None, fingerprint=None, **meta):
        if trace_ids is None or len(trace_ids) != batch_size:
            raise ForesightError("the DAgger mixture policy needs trace_ids=[...] (one per row) to find α")
        self._rows = [self.labels[t] for t in trace_ids]
        self._expert = [self.expert[t] for t in trace_ids]
        self._gens = [draw_generators(self.seed, self.round_idx, t, num_layers) for t in trace_ids] \
            if self.temperature else []
        self._acted: list[int] = []  # rows whose scorer acts at the current (event, layer)
        if self.scorer is not None:
            if fingerprint is not None:
                self.scorer.check_compatible(fingerprint)
            self.scorer.to(device)
        self.extractor.reset(num_layers, num_groups)

    def observe(self, view):
        self.extractor.observe(view)

    @torch.no_grad()
    def score(self, view):
        feats = self.extractor.features(view)  # once per event and layer: it folds the running sums
        pos = view.candidate_positions
        scores = pos.float().clone()  # recency for rows whose trace has ended (padding)
        learned = None
        n_evict = view.num_candidates - view.num_keep
        self._acted = []
        for b, lab in enumerate(self._rows):
            if view.event >= len(lab.events):
                continue
            alpha = lab.alpha_at(view.event, view.layer_idx, pos[b])
            oracle = oracle_keep_scores(alpha)
            if self.on_row is not None:
                self.on_row(b, view, feats[b], alpha, oracle < n_evict)
            if bool(self._expert[b][view.event]) or self.scorer is None:
                scores[b] = oracle.to(scores.device)
            else:
                if learned is None:
                    learned = self.scorer(feats.index_select(-1, self.columns.to(feats.device)),
                                          layer_idx=view.layer_idx)
                    if not bool(torch.isfinite(learned).all()):
                        raise ForesightError(f"the round's scorer produced NaN/Inf scores at event {view.event}, "
                                             f"layer {view.layer_idx}; its training diverged (lower lr?)")
                    learned = self._actor.adjust(view, learned)
                scores[b] = learned[b].float()
                self._acted.append(b)
        return scores

    def select(self, scores, num_keep, view):
        keep = super().select(scores, num_keep, view)
        c = scores.shape[-1]
        if self.temperature:
            for b in self._acted:  # the learned policy's selection=sample, on this trace's own generator
                order = sample_eviction(scores[b], c - num_keep, self.temperature,
                                        self._gens[b][view.layer_idx]).order
                keep[b] = kept_indices(order, c, num_keep)
        elif self._acted and self._actor.topk_spread:  # the learned policy's top-k with its spread
            acted = torch.tensor(self._acted, device=keep.device)
            keep[acted] = self._actor.keep_topk(scores[acted], num_keep, view)
        return keep

    def on_evict(self, layer_idx, keep):
        self.extractor.on_evict(layer_idx, keep)


def collect_onpolicy_events(model, sequences, trace_ids, labels: dict, scorer, extractor_factory,
                            columns: torch.Tensor, budget: int, interval: int, round_idx: int, beta: float,
                            seed: int, feature_dtype: torch.dtype = torch.float16,
                            batch_size: int = 1, temperature: float = 0.0) -> list[RecordedEvents]:
    """Replay ``sequences`` under π_r and record, at every event, the candidates its cache holds: features
    (E, L, Hkv, C, D), α and the oracle's evict set for that cache, positions (one
    :class:`~training.event_files.RecordedEvents` per trace with events). ``labels`` maps trace id ->
    :class:`golden.labels.TraceLabels` (format /3); ``scorer`` None means the oracle acts at every event;
    ``extractor_factory()`` returns a fresh extractor of the groups to record, of which ``columns`` are the scorer's
    features; ``temperature`` > 0 samples the scorer's evictions (:class:`MixturePolicy`)."""
    num_layers = model.config.num_hidden_layers
    out = []
    for s0 in range(0, len(sequences), batch_size):
        seqs, ids = sequences[s0 : s0 + batch_size], list(trace_ids[s0 : s0 + batch_size])
        rec: dict[tuple[int, int], dict[int, tuple]] = {}

        def on_row(b, view, feats, alpha, evicted, rec=rec):
            rec.setdefault((b, view.event), {})[view.layer_idx] = (
                feats.detach().to("cpu", feature_dtype), alpha.float().cpu(), evicted.cpu(),
                view.candidate_positions[b].to("cpu", torch.int32))

        expert = {t: expert_events(seed, round_idx, t, len(labels[t].events), beta) for t in ids}
        policy = MixturePolicy(extractor=extractor_factory(), scorer=scorer, columns=columns, labels=labels,
                               expert=expert, on_row=on_row, temperature=temperature, seed=seed,
                               round_idx=round_idx)
        replay(model, [list(map(int, s)) for s in seqs], policy, budget, interval, trace_ids=ids, logits=False)
        for b, tid in enumerate(ids):
            labels[tid].release_foresight()  # read lazily from the label file: hold one batch's at a time
            keys = sorted(k for k in rec if k[0] == b)
            if keys:
                out.append(stack_events(tid, [rec[k] for k in keys], num_layers))
    return out
