"""Stage 1: distil the Golden Eviction oracle into the learned scorer (docs/training.md).

Pipeline of ``foresight train sl`` (settings: :class:`training.sl_config.SLConfig`):

1. **Features** (:mod:`training.sl_features`). Every trace is replayed teacher-forced along its golden
   trajectory while the scorer's own :class:`~foresight.features.FeatureExtractor` records, at every event, the
   candidates' features (L, Hkv, C, D) and their targets from the labels: foresight values α and the golden
   evict set. The LLM is frozen. Features are cached per trace on disk (``feature_cache``; safetensors, fp16 by
   default), so re-runs with other scorer settings skip the replay. With several ranks each rank extracts its
   share of traces.
2. **Training.** Items are events; a step draws ``micro_batch`` events per rank (:class:`training.loop.StepSampler`)
   and minimises the pairwise ranking hinge loss (:func:`training.ranking.pairwise_hinge_loss`) through DeepSpeed
   (:func:`training.loop.train`).
3. **Validation** on held-out traces (split by problem, :func:`training.provenance.split_problems`, so samples of
   one problem never straddle the split): evict-set overlap with golden and ranking AUC on the golden
   trajectory (:mod:`training.ranking`), with the same metrics for random and recency scores as reference; at
   the end the fidelity loss ratio of the ``learned`` policy next to baseline policies
   (:func:`evaluation.fidelity.evaluate_fidelity`).

This module holds the :class:`training.loop.Task` of distillation and its entry point :func:`run_sl`.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from evaluation.fidelity import evaluate_fidelity
from foresight.errors import ForesightError
from foresight.fingerprint import weights_dtype
from foresight.features import FEATURE_GROUPS, feature_columns
from foresight import model_fingerprint
from foresight.policies import make_policy
from foresight.scorer import Scorer, ScorerConfig, scorer_sha256
from golden.labels import check_label_tokens, check_labels_match, load_labels, merge_labels
from golden.traces import load_traces
from training.dagger import refuse_fresh, run_dagger
from training.digests import digest, digest_rows
from training.distributed import init_distributed, out_dir_lock
from training.loop import check_step_memory, run_task, task_model
from training.out_dir import FEATURES, check_claim
from training.provenance import split_problems, stamp
from training.ranking import pairwise_hinge_loss, ranking_metrics
from foresight.run_lock import locked_out_dir
from training.sl_config import SLConfig
from training.sl_features import FeatureCache

#: Training events (a seeded uniform sample across all training traces) the feature standardisation is fitted on.
NORMALIZER_EVENTS = 64


def normalizer_sample(num_events: int, seed: int, size: int | None = None) -> torch.Tensor:
    """Sorted indices of ``min(size, num_events)`` distinct events drawn uniformly (seeded) from the pooled
    events of all training traces: the scorer's standardisation statistics are fitted on them, so that they
    describe every trace rather than the first few (docs/training.md). ``size`` defaults to
    :data:`NORMALIZER_EVENTS`."""
    size = NORMALIZER_EVENTS if size is None else size
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(num_events, generator=gen)[: min(size, num_events)].sort().values


def _measure_of(labels: dict) -> dict:
    """``{"label_measure": m}`` when the labels' oracle measured something other than the method's attention
    (``foresight golden --measure``; :func:`golden.labels.merge_labels` saw to it that they share one), else
    nothing: the provenance of every scorer trained on attention labels stays as it was."""
    measure = next(iter(labels.values())).measure
    return {} if measure == "attention" else {"label_measure": measure}


class SLData:
    """What distillation trains and validates on, loaded before the model (:class:`training.loop.TaskData`): the
    traces that have labels, their token ids checked against the labels, sorted by id, cut to ``max_traces`` and
    split by problem."""

    def __init__(self, cfg: SLConfig):
        ds = load_traces(cfg.traces)
        paths = [cfg.labels] if isinstance(cfg.labels, (str, Path)) else list(cfg.labels)
        labels = merge_labels((p, load_labels(p, complete=True)) for p in paths)  # not the traces labelled so far
        rows = [r for r in ds if r["trace_id"] in labels]
        if not rows:
            raise ForesightError(f"no trace of {cfg.traces} has labels in {cfg.labels}")
        check_label_tokens(labels, ((r["trace_id"], r["input_ids"]) for r in rows))  # same ids, same tokens
        rows.sort(key=lambda r: r["trace_id"])
        if cfg.max_traces:
            rows = rows[: cfg.max_traces]
        held = split_problems([r["problem_id"] for r in rows], cfg.heldout, cfg.split_seed)
        self.train_rows = [r for r in rows if r["problem_id"] not in held]
        self.val_rows = [r for r in rows if r["problem_id"] in held]
        self.labels = labels
        self.init_scorer = cfg.init_scorer

    def resume_identity(self) -> dict:
        """Content digests of the split's traces, of their labels and of ``init_scorer`` when set (a resume must use
        the same data and start from the same scorer)."""
        ids = [r["trace_id"] for r in self.train_rows + self.val_rows]
        labels = digest(x for t in ids for ev in self.labels[t].events
                        for x in (t, ev.end, ev.candidates, ev.alpha, ev.evicted))
        out = {"traces": f"{digest_rows(self.train_rows)}/{digest_rows(self.val_rows)}", "labels": labels}
        if self.init_scorer:  # only when set, so the identity of runs without one is what it was
            out["init_scorer"] = scorer_sha256(self.init_scorer)
        return out


class SLTask:
    """The :class:`training.loop.Task` of distillation: events with cached features, hinge loss, metrics.

    ``data`` (:class:`SLData`, loaded here when not given) is checked against the model: labels made for it at
    this B and W."""

    def __init__(self, cfg: SLConfig, dist, model=None, data: SLData | None = None):
        self.cfg, self.dist = cfg, dist
        self.data = data = data if data is not None else SLData(cfg)
        self.train_rows, self.val_rows, self.labels = data.train_rows, data.val_rows, data.labels
        self.model = model = task_model(cfg, dist, model)
        check_labels_match(self.labels, model, cfg.budget, cfg.interval)
        fp = model_fingerprint(model)
        provenance = {
            "trainer": "sl", "traces": cfg.traces, "labels": cfg.labels,
            "train_traces": [r["trace_id"] for r in self.train_rows],
            "heldout_traces": [r["trace_id"] for r in self.val_rows],
            "steps": cfg.steps, **stamp(), "config": {k: v for k, v in asdict(cfg).items()},
            **_measure_of(self.labels),
        }
        self.init_state = None
        if cfg.init_scorer:  # fine-tuning: its network, selection defaults and feature window, moved to this (B, W)
            init = Scorer.from_pretrained(cfg.init_scorer, model=model)
            self.init_state = {k: v.detach().clone() for k, v in init.state_dict().items()}
            provenance.update(init_scorer=cfg.init_scorer, init_scorer_sha256=scorer_sha256(cfg.init_scorer))
            self.scorer_config = replace(init.config.moved_to(cfg.budget, cfg.interval), fingerprint=fp,
                                         provenance=provenance)
        else:
            self.scorer_config = ScorerConfig(
                fingerprint=fp, budget=cfg.budget, interval=cfg.interval, feature_set=tuple(cfg.feature_set),
                hidden=cfg.hidden, decay=cfg.decay, provenance=provenance)
        layers, kv_heads = fp["num_layers"], fp["num_kv_heads"]  # an event's features, in fp32, with their gradient
        check_step_memory(cfg, dist, 3 * 4 * layers * kv_heads * cfg.budget * self.scorer_config.input_dim)
        # each rank extracts its share into the on-disk cache (the scorer's feature groups, or every group), then
        # everyone loads everything, keeping the configured feature set's columns
        groups = cfg.feature_set if cfg.feature_cache_groups == "scorer" else tuple(FEATURE_GROUPS)
        self.feature_cache = cache = FeatureCache(
            cfg.feature_cache or Path(cfg.out_dir) / FEATURES, fp, cfg.budget, cfg.interval, cfg.decay,
            cfg.feature_dtype, weights_dtype(model), self.scorer_config.feature_window, groups)
        cache.extract(model, self.train_rows + self.val_rows, self.labels, dist, cfg.replay_batch_size)
        self.columns = torch.tensor(feature_columns(cfg.feature_set, tuple(FEATURE_GROUPS), fp["head_dim"],
                                                    fp["num_heads"] // fp["num_kv_heads"]))
        self.train = cache.load(self.train_rows, self.columns, self.labels)
        self.val = cache.load(self.val_rows, self.columns, self.labels)
        if self.train is None:
            raise ForesightError("the training traces have no eviction events (traces shorter than B + W?)")
        self.init_scorer()
        self.baselines = self._baseline_metrics() if dist.is_main else {}

    def init_scorer(self) -> None:
        """A fresh scorer (seeded) standardised on ``self.train``, or with ``init_scorer`` a copy of that scorer,
        its standardisation included (DAgger calls it again on aggregated rows)."""
        self.module = Scorer(self.scorer_config, seed=self.cfg.seed)
        if self.init_state is not None:
            self.module.load_state_dict(self.init_state)
        else:
            norm_idx = normalizer_sample(self.train["features"].shape[0], self.cfg.seed)
            self.module.fit_normalizer(self.train["features"][norm_idx].float().transpose(0, 1))  # (L, E, K, C, D)
            self.scorer_config.provenance["normalizer_events"] = len(norm_idx)
        self.scorer_config.provenance["train_events"] = int(self.train["features"].shape[0])
        self.scorer_config.provenance["heldout_events"] = 0 if self.val is None else int(self.val["features"].shape[0])

    # -- loop.Task ------------------------------------------------------------------------------------------------
    def num_items(self) -> int:
        return int(self.train["features"].shape[0])

    def resume_identity(self) -> dict:
        return self.data.resume_identity()

    def loss(self, model, items: list[int], step: int):
        idx = torch.tensor(items)
        x = self.train["features"][idx].to(self.dist.device).float().transpose(0, 1)  # (L, e, K, C, D)
        alpha = self.train["alpha"][idx].to(self.dist.device).transpose(0, 1)
        evicted = (self.train["evicted"][idx].to(self.dist.device).transpose(0, 1)
                   if self.cfg.pair_weight == "boundary" else None)
        scores = model(x)
        gen = torch.Generator().manual_seed(self.cfg.seed * 7919 + step * 104729 + self.dist.rank)
        total, _ = pairwise_hinge_loss(scores, alpha, self.cfg.margin, self.cfg.max_pairs, gen,
                                       self.cfg.pair_weight, evicted)
        return total, {}

    @torch.no_grad()
    def val_scores(self) -> torch.Tensor:
        feats = self.val["features"]
        out = []
        for s0 in range(0, feats.shape[0], 8):
            x = feats[s0 : s0 + 8].to(self.dist.device).float().transpose(0, 1)
            out.append(self.module(x).transpose(0, 1).cpu())
        return torch.cat(out)  # (E, L, K, C)

    def _baseline_metrics(self) -> dict:
        if self.val is None:
            return {}
        gen = torch.Generator().manual_seed(0)
        rnd = torch.rand(self.val["alpha"].shape, generator=gen)
        out = {}
        for name, s in (("random", rnd), ("recency", self.val["positions"][:].float())):
            m = ranking_metrics(s, self.val["evicted"][:], self.cfg.eval_max_rows)
            out.update({f"{name}_overlap": m["overlap"], f"{name}_auc": m["auc"]})
        return out

    def evaluate(self, step: int, final: bool) -> dict:
        if not self.dist.is_main or self.val is None:
            return {}
        self.module.eval()
        m = ranking_metrics(self.val_scores(), self.val["evicted"][:], self.cfg.eval_max_rows)
        res = {"overlap": m["overlap"], "auc": m["auc"], **self.baselines}
        if final and self.cfg.eval_fidelity:
            res["fidelity"] = self.fidelity()
        return res

    def fidelity(self) -> list[dict]:
        rows = self.val_rows[: self.cfg.fidelity_max_traces or None]
        learned = make_policy("learned", scorer=self.module)
        kwargs = {"golden": {"labels": {r["trace_id"]: self.labels[r["trace_id"]] for r in rows}}}
        recs = evaluate_fidelity(
            self.model, [r["input_ids"] for r in rows], [learned, *self.cfg.fidelity_policies], [self.cfg.budget],
            self.cfg.interval, trace_ids=[r["trace_id"] for r in rows], policy_kwargs=kwargs,
        )
        keep = ("policy", "loss_ratio", "delta_ce", "kl", "top1_agreement", "tokens", "traces")
        return [{k: r[k] for k in keep if k in r} for r in recs]


def run_sl(cfg: SLConfig, resume: bool = False, model=None, overwrite: bool = False) -> dict[str, Any]:
    """Extract features, train, validate; write ``<out_dir>/scorer`` and ``<out_dir>/summary.json``.
    ``dagger_rounds > 0`` adds on-policy relabelling rounds (:mod:`training.dagger`). ``out_dir``'s lock is taken
    first (:func:`training.distributed.out_dir_lock`), so a second run on it hears that it is in use; ``overwrite``
    replaces an earlier run there."""
    with out_dir_lock(cfg.out_dir, init_distributed(cfg.device)):
        # either kind of earlier run, before anything loads (plain: rounds/ too, not only checkpoints)
        check_claim(cfg, resume, overwrite, refuse=refuse_fresh)
        if cfg.dagger_rounds:
            return run_dagger(cfg, SLData, lambda dist, c, data: SLTask(c, dist, model=model, data=data),
                              resume=resume, overwrite=overwrite)

        return run_task(
            cfg, SLData, lambda dist, data: SLTask(cfg, dist, model=model, data=data), resume=resume,
            describe=lambda task: (f"{len(task.train_rows)} train traces ({task.num_items()} events), "
                                   f"{len(task.val_rows)} held-out traces; scorer input dim "
                                   f"{task.scorer_config.input_dim}"),
            overwrite=overwrite,
        )
