"""The learned policy: the ForesightKV scorer over the shared feature extractor (docs/training.md, "The scorer").

Features come from :class:`foresight.features.FeatureExtractor` (the same object type the distillation
replay uses), scores from :class:`foresight.scorer.Scorer` (higher = keep).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from foresight.errors import ForesightError
from foresight.feature_groups import log_age
from foresight.policies.base import EvictionPolicy, check_range, check_seed
from foresight.policies.registry import register_policy
from foresight.sampling import EvictionDraw, kept_indices, layer_generators, sample_eviction, spread_keep, top_keep
from foresight.scorer import SELECTIONS, Scorer, layer_scores, layers_scores
from foresight.views import EvictLayersView, EvictView, LayersView, StepView, kept_entries


CPP_COMPILERS = ("g++", "clang++", "c++")


def _cpp_compiler() -> str | None:
    """A C++ compiler on the PATH ($CXX first), which inductor needs for CPU code; None without one."""
    for name in (os.environ.get("CXX"), *CPP_COMPILERS):
        if name and shutil.which(name):
            return name
    return None


def event_scores(extractor, view: EvictView, state, params: tuple, bonus: float, prior: float,
                 num_layers: int | None = None) -> tuple[torch.Tensor, ...]:
    """An event of one layer, or of ``num_layers`` layers folded into the batch (:meth:`EvictLayersView.folded`), as
    ``compile=true`` runs it, compiled: :meth:`~foresight.features.FeatureExtractor.features` from the ``state``
    (:meth:`~foresight.features.FeatureExtractor.layer_state` or ``layers_state``), the scorer's scores with the
    layers' ``params`` (:meth:`~foresight.scorer.Scorer.layer_params`), :func:`finite_flags` and the scores
    :func:`adjusted` by the newcomer ``bonus`` and the age ``prior``; all (rows, Hkv, C[, D]) as the view's."""
    extractor.fold(state)
    feats = extractor.groups(view, state)
    if num_layers is None:
        raw = layer_scores(feats, *params)
    else:
        raw = layers_scores(feats.unflatten(0, (num_layers, -1)), *params).flatten(0, 1)
    return feats, adjusted(view, raw, bonus, prior), finite_flags(view, raw, num_layers or 1)


def topk_keep(scores: torch.Tensor, num_keep: int, spread: float) -> torch.Tensor:
    """``selection=topk``'s kept candidates: the highest ``scores`` (:func:`~foresight.sampling.top_keep`), with
    :func:`~foresight.sampling.spread_keep` when ``spread`` is nonzero."""
    return spread_keep(scores, num_keep, spread) if spread else top_keep(scores, num_keep)


def event_keep(extractor, view: EvictView, state, params: tuple, bonus: float, prior: float,
               spread: float) -> tuple[torch.Tensor, ...]:
    """One layer's whole event under ``selection=topk``, as ``compile=true`` runs it, in one compiled call:
    :func:`event_scores`, then the cache's rule (:func:`~foresight.views.kept_entries`) with :func:`topk_keep`.
    Returns the features, the kept entries and the finite flags."""
    feats, scores, ok = event_scores(extractor, view, state, params, bonus, prior)
    return feats, kept_entries(view, scores, lambda s, k, v: topk_keep(s, k, spread)), ok


def adjusted(view, scores: torch.Tensor, bonus: float, prior: float) -> torch.Tensor:
    """The (B, Hkv, C) ``scores`` plus ``bonus`` for the candidates judged for the first time (the protected newest at
    the previous event), less ``prior * log1p(age)`` (:meth:`LearnedPolicy.adjust`)."""
    if bonus:
        first_judged = max(view.num_candidates - view.num_protected, 0)
        scores = scores.clone()
        scores[..., first_judged:] += bonus
    if prior:
        scores = scores - prior * log_age(view.positions, scores.shape[-1])
    return scores


def finite_flags(view, scores: torch.Tensor, num_layers: int) -> torch.Tensor:
    """(num_layers,) whether each layer's ``scores`` of the live candidates are finite."""
    live = view.valid[..., : view.num_candidates]
    return torch.isfinite(scores).masked_fill(~live, True).reshape(num_layers, -1).all(-1)


@register_policy
@dataclass
class LearnedPolicy(EvictionPolicy):
    """The distilled ForesightKV scorer (``--policy-arg scorer=DIR``).

    Parameters
    ----------
    scorer
        A scorer directory (``foresight train sl`` output) or a :class:`~foresight.scorer.Scorer`.
    selection
        ``topk``: keep the highest scores (deterministic). ``sample``: draw the evicted set without
        replacement from *all* candidates by Plackett–Luce with logits ``-score / temperature``
        (:func:`foresight.sampling.sample_eviction`, the very draw GRPO trains). Default: the one the scorer
        records (``selection`` in its config, chosen on held-out trace sets when it was exported), else ``topk``.
    temperature
        Temperature of ``sample``; default: the one the scorer was trained with (``temperature`` in its
        config, recorded by GRPO), else 1.0.
    seed
        Seed of the sampling generators, one per layer (:func:`~foresight.sampling.layer_generators`), re-applied
        at every reset.
    newcomer_bonus
        Added to the scores of the candidates that were the protected newest ``W`` at the previous event (the
        entries judged for the first time, on the least evidence), under either selection; 0 leaves the scores as
        trained. Default: under ``topk`` the one the scorer records (``newcomer_bonus`` in its config, chosen on
        validation traces), else 0.
    spread
        With ``topk``: evict one candidate at a time and add ``spread`` to its two cache neighbours' scores
        (:func:`foresight.sampling.spread_keep`), so near-tied neighbours are not evicted as a whole span; 0 is
        plain top-k. Default: the one the scorer records (``spread`` in its config, chosen on validation traces),
        else 0.
    age_prior
        ``lam`` >= 0: subtract ``lam * log1p(t - position)`` from every candidate's score (``t`` the newest position
        plus one), under either selection, so that an entry ranked just above the eviction boundary does not stay
        forever: a sampled draw evicts such an entry with some probability at every event, top-k never does, and
        this gives top-k the same decay with age. Default: under ``topk`` the one the scorer records (``age_prior``
        in its config), else 0 (the scores as trained).
    compile
        ``torch.compile`` each event (the features, the scorer and the adjusted scores of one layer or of the layers
        scored at once, and the top-k with spread) into fixed-shape code (past torch's ``recompile_limit`` of shapes,
        the others run eagerly): ``true`` (inductor) or a ``torch.compile`` backend (a name or a callable). The
        first events of each cache shape compile (seconds to tens of seconds, cached on disk across runs); later ones
        run without most of Python's per-operation overhead, which is most of what an event costs on a CPU. The same
        functions run as eagerly, so it evicts alike up to float rounding.
        Off by default: it pays in long jobs (a replay of many traces), not in one short one.
    any_budget
        Run the scorer at a budget/interval other than the (B, W) its config records (the one it was trained at,
        or the one ``foresight export --budget B --interval W`` moved it to after measuring it there). Off by
        default: its features (the recent-query window stays the W it was trained at) and its ranking were learned
        or checked for that setting, so a cache of another (B, W) is refused rather than silently measured; turn it
        on for a deliberate transfer experiment.
    """

    name: ClassVar[str] = "learned"
    observes: ClassVar[bool] = True
    observes_layers: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True
    scorer: Any = None
    selection: str | None = None
    temperature: float | None = None
    seed: int = 0
    newcomer_bonus: float | None = None
    spread: float | None = None
    age_prior: float | None = None
    any_budget: bool = False
    compile: bool | str | Callable = False
    _scorer: Any = field(default=None, init=False, repr=False)
    _extractor: Any = field(default=None, init=False, repr=False)
    _gens: Any = field(default=None, init=False, repr=False)
    _finite: list = field(default_factory=list, init=False, repr=False)
    _event_fn: Any = field(default=None, init=False, repr=False)
    _spread_fn: Any = field(default=None, init=False, repr=False)
    _keep_fn: Any = field(default=None, init=False, repr=False)
    on_features: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.selection is not None and self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if self.temperature is not None:
            check_range("temperature", self.temperature, 1e-6)
        if self.newcomer_bonus is not None:
            check_range("newcomer_bonus", self.newcomer_bonus, 0.0)
        if self.age_prior is not None:
            check_range("age_prior", self.age_prior, 0.0)
        if self.spread is not None:
            check_range("spread", self.spread, 0.0)
        check_seed(self.seed)
        if not (isinstance(self.compile, bool) or callable(self.compile) or (isinstance(self.compile, str)
                                                                         and self.compile)):
            raise ValueError(f"compile must be true, false or a torch.compile backend, got {self.compile!r}")
        if self.scorer is None:
            raise ForesightError("the learned policy needs a scorer: --policy-arg scorer=DIR")
        if not isinstance(self.scorer, (Scorer, str, Path)):  # scorer=2024 reads as a number: a TypeError before
            raise ForesightError(f"scorer must be a scorer directory or a shipped scorer's name, got {self.scorer!r}; "
                                 f"quote a name that reads as a number: scorer=\"'{self.scorer}'\"")
        if self.on_features is not None and not callable(self.on_features):  # a TypeError at the first event
            raise ForesightError(f"on_features must be a callable f(view, features), got {self.on_features!r}")
        self._scorer = self.scorer if isinstance(self.scorer, Scorer) else Scorer.from_pretrained(Path(self.scorer))
        self._scorer.eval()
        self._extractor = self._scorer.config.extractor()
        self._check_selection_args()
        if self.compile:
            backend = "inductor" if self.compile is True else self.compile
            if backend == "inductor" and not torch.cuda.is_available() and not _cpp_compiler():
                raise ForesightError(f"compile={self.compile}: inductor on the CPU builds C++ and no compiler was "
                                     f"found (CXX, {', '.join(CPP_COMPILERS)}); install one, or drop compile")
            # not fullgraph: past torch's recompile_limit a new shape then runs eagerly (dynamo warns) instead of
            # failing a long job; both functions trace whole (tests/policies/test_compiled_events.py counts frames)
            try:
                self._event_fn = torch.compile(event_scores, backend=backend, dynamic=False)
            except torch._dynamo.exc.InvalidBackend:
                raise ValueError(f"compile={self.compile!r} is not a torch.compile backend; use true or one of "
                                 f"{', '.join(torch._dynamo.list_backends())}") from None
            self._spread_fn = torch.compile(spread_keep, backend=backend, dynamic=False)
            if self.applied_selection == "topk" and all(getattr(type(self), name) is getattr(LearnedPolicy, name)
                                                         for name in ("score", "select", "keep_topk", "adjust")):
                # a subclass that ranks or selects otherwise (DAgger's mixture) keeps the two steps
                self._keep_fn = torch.compile(event_keep, backend=backend, dynamic=False)

    def _check_selection_args(self) -> None:
        """Refuse an argument the selection in use never reads: recorded with the results, it would claim a draw or
        a neighbour rule that never happened."""
        sel = self.applied_selection
        how = ("" if self.selection else " (this scorer's recorded default)" if self._scorer.config.selection
               else " (the default)")
        if self.temperature is not None and sel != "sample":
            raise ValueError(f"temperature={self.temperature} is used by selection=sample only, and selection is "
                             f"{sel}{how}; drop it or add selection=sample")
        if self.spread and sel != "topk":
            raise ValueError(f"spread={self.spread} is used by selection=topk only, and selection is {sel}{how}; "
                             "drop it or add selection=topk")

    def check_cache(self, budget, interval):
        cfg = self._scorer.config
        if self.any_budget or budget is None or (budget, interval) == (cfg.budget, cfg.interval):
            return
        raise ValueError(
            f"scorer {self._scorer.source or '(in memory)'} is for B={cfg.budget} W={cfg.interval}, not "
            f"B={budget} W={interval} (its recent-query window is {cfg.feature_window}); use a scorer made for this "
            "setting, or policy argument any_budget=true for a deliberate transfer experiment"
        )

    @property
    def applied_selection(self) -> str:
        """The selection in use: explicit, else the scorer's recorded default, else ``topk``."""
        return self.selection or self._scorer.config.selection or "topk"

    @property
    def sampling_temperature(self) -> float:
        """The temperature ``sample`` uses: explicit, else the scorer's recorded one, else 1.0."""
        if self.temperature is not None:
            return float(self.temperature)
        return float(self._scorer.config.temperature or 1.0)

    def _topk_default(self, name: str) -> float:
        """Argument ``name`` of :data:`~foresight.scorer.TOPK_DEFAULTS` as used: explicit, else under ``topk`` the
        scorer's recorded one, else 0."""
        explicit = getattr(self, name)
        if explicit is not None:
            return float(explicit)
        return float(getattr(self._scorer.config, name) or 0.0) if self.applied_selection == "topk" else 0.0

    @property
    def topk_spread(self) -> float:
        """The spread ``topk`` uses (0 under ``sample``, where a spread is refused)."""
        return self._topk_default("spread")

    @property
    def applied_newcomer_bonus(self) -> float:
        """The newcomer bonus this policy adds."""
        return self._topk_default("newcomer_bonus")

    @property
    def applied_age_prior(self) -> float:
        """The age prior this policy subtracts (times ``log1p(age)``)."""
        return self._topk_default("age_prior")

    @property
    def extractor(self):
        return self._extractor

    @property
    def model(self):
        return self._scorer

    def config(self) -> dict:
        cfg = super().config()
        cfg["scorer"] = str(self.scorer) if not hasattr(self.scorer, "config") else "<in-memory>"
        cfg.pop("on_features", None)
        if callable(self.compile):
            cfg["compile"] = getattr(self.compile, "__name__", type(self.compile).__name__)
        cfg["selection"] = self.applied_selection  # the one used, recorded with results
        cfg["temperature"] = self.sampling_temperature  # the one used, recorded with results
        cfg["spread"] = self.topk_spread  # likewise
        cfg["newcomer_bonus"] = self.applied_newcomer_bonus
        cfg["age_prior"] = self.applied_age_prior
        return cfg

    def reset(self, batch_size, num_layers, device, num_groups: int = 1, fingerprint=None, **meta):
        if fingerprint is not None:  # the runtime passes the model's fingerprint: same check as every loader
            self._scorer.check_compatible(fingerprint)
        self._scorer.check_shape(num_layers, num_groups=num_groups)
        self._scorer.to(device)
        self._extractor.reset(num_layers, num_groups)
        self._gens = layer_generators(self.seed, num_layers)
        self._finite = []  # (event, layer, all scores finite) of the current event, read at its end

    def observe(self, view: StepView) -> None:
        self._extractor.observe(view)

    def observe_layers(self, view: LayersView) -> None:
        self._extractor.observe_layers(view)

    @property
    def selects_rows(self) -> bool:
        """Under ``topk`` (``sample`` draws each layer's noise for the whole batch from one generator)."""
        return self.applied_selection == "topk"

    def select_rows(self, rows: torch.Tensor) -> None:
        self._extractor.select_rows(rows)

    @property
    def scores_layers(self) -> bool:
        """Every layer of an event at once under ``topk`` (``sample`` draws from one generator per layer) when no
        ``on_features`` callback waits for one layer's features."""
        return self.applied_selection == "topk" and self.on_features is None

    def _compiled_event(self, fn, view: EvictView, *args) -> torch.Tensor:
        """One layer's event by the compiled ``fn`` (:func:`event_scores` or :func:`event_keep`, its extra ``args``
        after the adjustments); returns its second output, after the callback and the finite check's note."""
        feats, out, ok = fn(self._extractor, view, self._extractor.layer_state(view.layer_idx),
                            self._scorer.layer_params(view.layer_idx), self.applied_newcomer_bonus,
                            self.applied_age_prior, *args)
        self._scored(view, feats, ok)
        return out

    def _scored(self, view: EvictView, feats: torch.Tensor, ok: torch.Tensor) -> None:
        """After a layer's scores: the ``on_features`` callback, and the finite flags read at the event's end."""
        if self.on_features is not None:
            self.on_features(view, feats)
        self._finite.append((view.event, range(view.layer_idx, view.layer_idx + 1), ok))

    def _check_layers(self, view: EvictView) -> None:
        """At each event's first layer: refuse a cache whose layers, KV heads or head size are not the scorer's."""
        if view.layer_idx == 0:
            self._scorer.check_shape(self._scorer.config.num_layers, view.keys.shape[1], None, view.keys.shape[-1])

    @torch.no_grad()
    def score(self, view: EvictView) -> torch.Tensor:
        self._check_layers(view)
        if self._event_fn is not None:
            return self._compiled_event(self._event_fn, view)
        feats = self._extractor.features(view)
        raw = self._layer_scores(view, feats)
        self._scored(view, feats, finite_flags(view, raw, 1))
        return self.adjust(view, raw)

    @torch.no_grad()
    def keep(self, view: EvictView, rule=kept_entries) -> torch.Tensor:
        """Compiled (``compile``, ``selection=topk``): the scores, the cache's rule (:func:`kept_entries`, what
        ``rule`` applies) and the top-k in one compiled call (:func:`event_keep`), the same entries as the two
        steps."""
        if self._keep_fn is None:
            return super().keep(view, rule)
        self._check_layers(view)
        return self._compiled_event(self._keep_fn, view, self.topk_spread)

    def _layer_scores(self, view: EvictView, feats: torch.Tensor) -> torch.Tensor:
        """The scorer's (B, Hkv, C) scores of the candidate features of ``view``'s layer (called without gradient)."""
        return self._scorer(feats, layer_idx=view.layer_idx)

    @torch.no_grad()
    def score_layers(self, view: EvictLayersView) -> torch.Tensor:
        if view.layers.start == 0:
            self._scorer.check_shape(self._scorer.config.num_layers, view.keys.shape[2], None, view.keys.shape[-1])
        layers = slice(view.layers.start, view.layers.stop)
        state = self._extractor.layers_state(view.layers) if self._event_fn is not None else None
        if state is not None:
            _, scores, ok = self._event_fn(self._extractor, view.folded(), state, self._scorer.layer_params(layers),
                                           self.applied_newcomer_bonus, self.applied_age_prior, view.num_layers)
            self._extractor.unfold(view.layers, state)
            scores = scores.unflatten(0, (view.num_layers, -1))
        else:
            raw = self._scorer(self._extractor.features_layers(view), layers)
            scores, ok = self.adjust(view, raw), finite_flags(view, raw, view.num_layers)
        self._finite.append((view.event, view.layers, ok))
        return scores

    def adjust(self, view: EvictView, scores: torch.Tensor) -> torch.Tensor:
        """The scorer's (B, Hkv, C) ``scores`` as this policy ranks them: plus the newcomer bonus, less the age prior
        (:func:`adjusted`; stateless; DAgger's rollouts apply it to the scorer's scores so that they act as this
        policy does, :class:`training.onpolicy.MixturePolicy`)."""
        return adjusted(view, scores, self.applied_newcomer_bonus, self.applied_age_prior)

    def draw(self, scores: torch.Tensor, num_keep: int, layer_idx: int) -> EvictionDraw:
        """The sampled eviction of ``selection=sample`` at layer ``layer_idx``, from that layer's generator (and of
        GRPO's rollout policy, which subclasses this)."""
        return sample_eviction(scores, scores.shape[-1] - num_keep, self.sampling_temperature, self._gens[layer_idx])

    def keep_topk(self, scores, num_keep, view):
        """``selection=topk``'s kept indices: the highest scores, with this policy's spread when it has one."""
        spread = self.topk_spread
        if spread and self._spread_fn is not None:
            return self._spread_fn(scores, num_keep, spread)
        return topk_keep(scores, num_keep, spread)

    def select(self, scores, num_keep, view):
        if self.applied_selection == "topk":
            return self.keep_topk(scores, num_keep, view)
        return kept_indices(self.draw(scores, num_keep, view.layer_idx).order, scores.shape[-1], num_keep)

    def on_evict(self, layer_idx, keep):
        self._extractor.on_evict(layer_idx, keep)

    def on_evict_layers(self, layers, keep):
        self._extractor.on_evict_layers(layers, keep)

    def end_event(self):
        """Refuse NaN/Inf scores of the event's layers (one read per event, see :meth:`score`)."""
        checks, self._finite = self._finite, []
        if not checks:
            return
        flags = torch.cat([ok for *_, ok in checks]).tolist()
        noted = [(event, layer) for event, layers, _ in checks for layer in layers]
        for (event, layer), ok in zip(noted, flags):
            if not ok:
                raise ForesightError(
                    f"scorer {self._scorer.source or '(in memory)'} produced NaN/Inf scores at event {event}, layer "
                    f"{layer}; ranking them would evict arbitrary entries (check its weights and "
                    "feature_mean/feature_std, or retrain it)")
