"""Stage 1: distil the Golden Eviction oracle into the learned scorer (DESIGN.md section 4).

Pipeline of ``foresight train sl``:

1. **Features.** Every trace is replayed teacher-forced (:func:`foresight.replay`, chunks of ``W``) with the
   ``golden`` policy driving the evictions, so the cache evolves exactly as the oracle evicted, while a
   :class:`~foresight.policies.recorder.FeatureRecorder` runs the scorer's own
   :class:`~foresight.features.FeatureExtractor` (the one the ``learned`` policy uses) and records, at every
   event, the candidates' features (L, Hkv, C, D) and their targets from the labels: foresight values α and
   the golden evict set. The LLM is frozen (eval mode, inference mode). Features are cached per trace on disk
   (``feature_cache``; safetensors, fp16 by default), so re-runs with other scorer settings skip the replay.
   With several ranks each rank extracts its share of traces.
2. **Training.** Items are events; a step draws ``micro_batch`` events per rank (:class:`training.loop.StepSampler`)
   and minimises the pairwise ranking hinge loss :func:`pairwise_hinge_loss` through DeepSpeed
   (:func:`training.loop.train`).
3. **Validation** on held-out traces (split by problem, so samples of one problem never straddle the split):
   evict-set overlap with golden and ranking AUC (scikit-learn) on the golden trajectory, with the same metrics
   for random and recency scores as reference; at the end the fidelity loss ratio of the ``learned`` policy
   next to baseline policies (:func:`evaluation.fidelity.evaluate_fidelity`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

import golden  # noqa: F401  (registers the "golden" policy)
from foresight.errors import ForesightError
from foresight.policies.registry import check_policy_names
from training.loop import TrainerConfig
from training.registry import register_trainer

FEATURE_CACHE_FORMAT = "foresight-sl-features/2"  # /2: cumulative features cover every query (issue 14)
#: Training events (a seeded uniform sample across all training traces) the feature standardisation is fitted on.
NORMALIZER_EVENTS = 64


# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class SLConfig(TrainerConfig):
    """Keys of ``configs/sl.yaml`` (documented there); validated on construction."""

    RUN_CONTROL: ClassVar[frozenset] = TrainerConfig.RUN_CONTROL | {  # traces/labels: by content, see SLTask
        "traces", "labels", "feature_cache", "replay_batch_size", "eval_max_rows", "eval_fidelity",
        "fidelity_policies", "fidelity_max_traces"}

    out_dir: str = "runs/sl"
    model: str = "smollm2-135m"
    dtype: str | None = None
    traces: str = ""
    labels: Any = ""
    budget: int = 128
    interval: int = 32
    max_traces: int = 0
    heldout: float = 0.25
    split_seed: int = 0
    feature_set: list = field(default_factory=lambda: ["key", "value", "attn"])
    hidden: int = 16
    decay: float = 0.9
    margin: float = 0.01
    max_pairs: int = 0
    feature_cache: str | None = None
    feature_dtype: str = "float16"
    replay_batch_size: int = 1
    eval_max_rows: int = 4000
    eval_fidelity: bool = True
    fidelity_policies: list = field(default_factory=lambda: ["streaming_llm", "random", "h2o", "golden"])
    fidelity_max_traces: int = 0
    dagger_rounds: int = 0
    dagger_beta: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        from foresight.features import check_feature_set

        if not self.traces or not self.labels:
            raise ValueError("set `traces` (a `foresight trace` directory) and `labels` (a `foresight golden` "
                             "directory)")
        if not 0 < self.interval < self.budget:
            raise ValueError(f"need 0 < interval < budget, got {self.interval}, {self.budget}")
        h = float(self.heldout)
        if not (0 < h < 1 or (h >= 1 and h == int(h))):
            raise ValueError(f"heldout must be a fraction in (0, 1) or a number of problems, got {self.heldout}")
        self.feature_set = list(check_feature_set(self.feature_set))
        if self.hidden < 1 or self.margin < 0 or self.max_pairs < 0 or self.replay_batch_size < 1:
            raise ValueError("hidden and replay_batch_size must be >= 1, margin and max_pairs >= 0")
        if self.feature_dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"feature_dtype must be float16, bfloat16 or float32, got {self.feature_dtype}")
        for key in ("max_traces", "fidelity_max_traces", "eval_max_rows"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0 (0 = all), got {getattr(self, key)}")
        check_policy_names(self.fidelity_policies, "fidelity_policies")  # a typo fails now, not after training
        if self.dagger_rounds < 0:
            raise ValueError(f"dagger_rounds must be >= 0 (0 = no on-policy rounds), got {self.dagger_rounds}")
        if not 0.0 <= self.dagger_beta <= 1.0:
            raise ValueError(f"dagger_beta must be in [0, 1], got {self.dagger_beta}")

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.init]


# ----------------------------------------------------------------------------------------------------------------
# Loss and ranking metrics
# ----------------------------------------------------------------------------------------------------------------


def pairwise_hinge_loss(scores: torch.Tensor, alpha: torch.Tensor, margin: float = 0.01, max_pairs: int = 0,
                        generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairwise ranking hinge loss of keep scores against foresight values (DESIGN.md section 4).

    Rows are the leading dims after the first (events x heads); the first dim is the layer. With targets
    ``o = -alpha`` and eviction scores ``phi = -scores``, a row's loss is the mean over pairs ``(i, j)`` with
    ``o_i > o_j`` (i.e. ``alpha_i < alpha_j``) of ``max(0, m - (phi_i - phi_j)) = max(0, m - (s_j - s_i))``.
    Rows without any ordered pair are left out; the total is the mean over rows, summed over layers.

    ``max_pairs > 0`` samples that many ``(i, j)`` index pairs per row uniformly (with replacement) instead of
    using all ``C^2`` pairs: an unbiased estimate of each row's mean for large ``C``.

    Returns
    -------
    (total, per_layer)
        Scalar loss and the (L,) per-layer losses.
    """
    L, c = scores.shape[0], scores.shape[-1]
    s = scores.reshape(L, -1, c)
    a = alpha.reshape(L, -1, c).to(s.dtype)
    if max_pairs and max_pairs < c * c:
        gen_dev = "cpu"
        i = torch.randint(c, (L, s.shape[1], max_pairs), generator=generator, device=gen_dev).to(s.device)
        j = torch.randint(c, (L, s.shape[1], max_pairs), generator=generator, device=gen_dev).to(s.device)
        pair = (a.gather(-1, i) < a.gather(-1, j)).to(s.dtype)
        hinge = torch.relu(margin - (s.gather(-1, j) - s.gather(-1, i)))
        num, den = (pair * hinge).sum(-1), pair.sum(-1)
    else:
        pair = (a[..., :, None] < a[..., None, :]).to(s.dtype)  # pair[i, j]: alpha_i < alpha_j
        hinge = torch.relu(margin - (s[..., None, :] - s[..., :, None]))  # m - (s_j - s_i)
        num, den = (pair * hinge).sum((-1, -2)), pair.sum((-1, -2))
    has = den > 0
    row = num / den.clamp(min=1)
    per_layer = (row * has).sum(-1) / has.sum(-1).clamp(min=1)
    return per_layer.sum(), per_layer


def evict_overlap(scores: torch.Tensor, evicted: torch.Tensor) -> torch.Tensor:
    """Per-row fraction of the golden evict set that the lowest keep scores would also evict.

    ``scores`` (..., C) keep scores, ``evicted`` (..., C) bool golden evict mask with the same count per row.
    """
    k = evicted.sum(-1, keepdim=True)
    kmax = int(k.max()) if k.numel() else 0
    if kmax == 0:
        return torch.zeros(scores.shape[:-1])
    low = scores.float().topk(kmax, dim=-1, largest=False).indices
    rank_ok = torch.arange(kmax, device=scores.device) < k  # rows with fewer evictions use their first k
    hit = evicted.gather(-1, low) & rank_ok
    return hit.sum(-1).float() / k.squeeze(-1).clamp(min=1).float()


def ranking_metrics(scores: torch.Tensor, evicted: torch.Tensor, max_rows: int = 0, seed: int = 0) -> dict:
    """Mean evict-set overlap and mean per-row ROC AUC (scikit-learn) of evicted-vs-kept over rows."""
    from sklearn.metrics import roc_auc_score

    c = scores.shape[-1]
    s = scores.reshape(-1, c).float().cpu()
    e = evicted.reshape(-1, c).cpu()
    overlap = evict_overlap(s, e)
    rows = torch.arange(s.shape[0])
    if max_rows and s.shape[0] > max_rows:
        rows = torch.randperm(s.shape[0], generator=torch.Generator().manual_seed(seed))[:max_rows]
    aucs = []
    for r in rows.tolist():
        y = e[r].numpy()
        if 0 < y.sum() < c:
            aucs.append(roc_auc_score(y, -s[r].numpy()))
    return {"overlap": float(overlap.mean()), "auc": float(sum(aucs) / len(aucs)) if aucs else float("nan"),
            "rows": int(s.shape[0])}


# ----------------------------------------------------------------------------------------------------------------
# Features along the golden trajectory
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TraceEvents:
    """Recorded events of one trace: features (E, L, Hkv, C, D), alpha, evicted mask, positions (E, L, Hkv, C)."""

    trace_id: str
    features: torch.Tensor
    alpha: torch.Tensor
    evicted: torch.Tensor
    positions: torch.Tensor


def collect_events(model, sequences, trace_ids, labels: dict, extractor_factory, budget: int, interval: int,
                   feature_dtype: torch.dtype = torch.float16, batch_size: int = 1) -> list[TraceEvents]:
    """Replay ``sequences`` along their golden trajectories and record features + targets at every event.

    ``labels`` maps trace id -> :class:`golden.labels.TraceLabels`; ``extractor_factory()`` returns a fresh
    :class:`~foresight.features.FeatureExtractor`.
    """
    from foresight.policies import make_policy
    from foresight.policies.recorder import FeatureRecorder
    from foresight.runtime import replay

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
                ev_mask = (cand[..., :, None] == ev.evicted[view.layer_idx][..., None, :]).any(-1)
                rec.setdefault((b, view.event), {})[view.layer_idx] = (
                    feats[b].detach().to("cpu", feature_dtype), ev.alpha[view.layer_idx].float(), ev_mask, pos.int()
                )

        golden = make_policy("golden", labels={t: labels[t] for t in ids})
        policy = FeatureRecorder(extractor=extractor_factory(), driver=golden, on_event=on_event)
        replay(model, [list(map(int, s)) for s in seqs], policy, budget, interval, trace_ids=ids)
        num_layers = model.config.num_hidden_layers
        for b, tid in enumerate(ids):
            keys = sorted(k for k in rec if k[0] == b)
            if not keys:
                continue
            per_event = [[rec[k][layer] for layer in range(num_layers)] for k in keys]
            stack = [torch.stack([torch.stack([ev[layer][i] for layer in range(num_layers)]) for ev in per_event])
                     for i in range(4)]
            out.append(TraceEvents(tid, *stack))
    return out


def _cache_key(fingerprint: dict, budget: int, interval: int, feature_set, decay: float, dtype: str) -> str:
    blob = json.dumps([fingerprint, budget, interval, list(feature_set), decay, dtype, FEATURE_CACHE_FORMAT],
                      sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _cache_file(cache_dir: Path, key: str, trace_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", trace_id)
    digest = hashlib.sha1(trace_id.encode()).hexdigest()[:8]
    return cache_dir / key / f"{safe}-{digest}.safetensors"


def save_events(path: Path, ev: TraceEvents) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({"features": ev.features.contiguous(), "alpha": ev.alpha.contiguous(),
               "evicted": ev.evicted.to(torch.uint8).contiguous(), "positions": ev.positions.contiguous()},
              str(tmp), metadata={"format": FEATURE_CACHE_FORMAT, "trace_id": ev.trace_id})
    tmp.replace(path)


def load_events(path: Path) -> TraceEvents:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        t = {k: f.get_tensor(k) for k in f.keys()}
    return TraceEvents(meta["trace_id"], t["features"], t["alpha"], t["evicted"].bool(), t["positions"])


# ----------------------------------------------------------------------------------------------------------------
# Data: traces, labels, split
# ----------------------------------------------------------------------------------------------------------------


def normalizer_sample(num_events: int, seed: int, size: int | None = None) -> torch.Tensor:
    """Sorted indices of ``min(size, num_events)`` distinct events drawn uniformly (seeded) from the pooled
    events of all training traces: the scorer's standardisation statistics are fitted on them, so that they
    describe every trace rather than the first few (DESIGN.md section 4). ``size`` defaults to
    :data:`NORMALIZER_EVENTS`."""
    size = NORMALIZER_EVENTS if size is None else size
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(num_events, generator=gen)[: min(size, num_events)].sort().values


def split_problems(problem_ids: list[str], heldout: float, seed: int) -> set[str]:
    """Held-out problem ids: a seeded shuffle of the distinct ids, the last ``heldout`` fraction (or count)."""
    uniq = sorted(set(problem_ids))
    order = sorted(uniq, key=lambda p: hashlib.sha1(f"{seed}\x00{p}".encode()).hexdigest())
    n = int(heldout) if heldout >= 1 else max(1, math.ceil(heldout * len(uniq)))
    if n >= len(uniq):
        raise ForesightError(f"heldout={heldout} leaves no training problems ({len(uniq)} problems in total)")
    return set(order[-n:])


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except Exception:
        return None


class SLTask:
    """The :class:`training.loop.Task` of distillation: events with cached features, hinge loss, metrics."""

    def __init__(self, cfg: SLConfig, dist, model=None):
        from foresight import model_fingerprint
        from foresight.scorer import ScorerConfig
        from golden.labels import check_label_tokens, check_labels_match, load_labels
        from golden.traces import load_traces
        from training.distributed import barrier
        from training.loop import task_model

        self.cfg, self.dist = cfg, dist
        self.model = model = task_model(cfg, dist, model)
        fp = model_fingerprint(model)
        ds = load_traces(cfg.traces)
        labels = {}
        for path in ([cfg.labels] if isinstance(cfg.labels, (str, Path)) else list(cfg.labels)):
            labels.update(load_labels(path))
        check_labels_match(labels, model, cfg.budget, cfg.interval)
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

        self.scorer_config = ScorerConfig(
            fingerprint=fp, budget=cfg.budget, interval=cfg.interval, feature_set=tuple(cfg.feature_set),
            hidden=cfg.hidden, decay=cfg.decay,
            provenance={
                "trainer": "sl", "traces": str(cfg.traces), "labels": cfg.labels,
                "train_traces": [r["trace_id"] for r in self.train_rows],
                "heldout_traces": [r["trace_id"] for r in self.val_rows],
                "steps": cfg.steps, "git_commit": git_commit(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "config": {k: v for k, v in asdict(cfg).items()},
            },
        )
        # -- features (each rank extracts its share into the on-disk cache, then everyone loads everything)
        # The cache always holds every feature group (FEATURE_GROUPS order); the configured set is a column
        # selection of it (groups are computed independently), so feature-set sweeps reuse one extraction.
        from foresight.features import FEATURE_GROUPS, FeatureExtractor, feature_columns

        dtype = getattr(torch, cfg.feature_dtype)
        cache_root = Path(cfg.feature_cache or Path(cfg.out_dir) / "features")
        full_set = tuple(FEATURE_GROUPS)
        key = _cache_key(fp, cfg.budget, cfg.interval, full_set, cfg.decay, cfg.feature_dtype)
        columns = torch.tensor(feature_columns(cfg.feature_set, full_set, fp["head_dim"],
                                               fp["num_heads"] // fp["num_kv_heads"]))

        def full_extractor():
            return FeatureExtractor(window=cfg.interval, feature_set=full_set, decay=cfg.decay)

        all_rows = self.train_rows + self.val_rows
        todo = [r for r in all_rows[dist.rank :: dist.world_size]
                if not _cache_file(cache_root, key, r["trace_id"]).exists()]
        bar = tqdm(total=len(todo), desc="features", unit="trace", disable=not (dist.is_main and todo),
                   dynamic_ncols=True)
        for s0 in range(0, len(todo), cfg.replay_batch_size):
            part = todo[s0 : s0 + cfg.replay_batch_size]
            events = collect_events(model, [r["input_ids"] for r in part], [r["trace_id"] for r in part], labels,
                                    full_extractor, cfg.budget, cfg.interval, dtype, len(part))
            for ev in events:
                save_events(_cache_file(cache_root, key, ev.trace_id), ev)
            bar.update(len(part))
        bar.close()
        barrier()

        def load(rows):
            evs = [load_events(_cache_file(cache_root, key, r["trace_id"])) for r in rows
                   if _cache_file(cache_root, key, r["trace_id"]).exists()]
            if not evs:
                return None
            out = {name: torch.cat([getattr(e, name) for e in evs]) for name in ("alpha", "evicted", "positions")}
            out["features"] = torch.cat([e.features.index_select(-1, columns) for e in evs])
            return out

        self.train = load(self.train_rows)
        self.val = load(self.val_rows)
        if self.train is None:
            raise ForesightError("the training traces have no eviction events (traces shorter than B + W?)")
        self.columns = columns  # the configured feature set's columns of the full feature vector
        self.init_scorer()
        self.baselines = self._baseline_metrics() if dist.is_main else {}

    def init_scorer(self) -> None:
        """A fresh scorer (seeded) standardised on ``self.train`` (DAgger calls it again on aggregated rows)."""
        from foresight.scorer import Scorer

        self.module = Scorer(self.scorer_config, seed=self.cfg.seed)
        norm_idx = normalizer_sample(self.train["features"].shape[0], self.cfg.seed)
        self.module.fit_normalizer(self.train["features"][norm_idx].float().transpose(0, 1))  # (L, E, K, C, D)
        self.scorer_config.provenance["normalizer_events"] = len(norm_idx)
        self.scorer_config.provenance["train_events"] = int(self.train["features"].shape[0])
        self.scorer_config.provenance["heldout_events"] = 0 if self.val is None else int(self.val["features"].shape[0])

    # -- loop.Task ------------------------------------------------------------------------------------------------
    def num_items(self) -> int:
        return int(self.train["features"].shape[0])

    def resume_identity(self) -> dict:
        """Content digests of the split's traces and of their labels (a resume must use the same data)."""
        from training.digests import digest, digest_rows

        ids = [r["trace_id"] for r in self.train_rows + self.val_rows]
        labels = digest(x for t in ids for ev in self.labels[t].events
                        for x in (t, ev.end, ev.candidates, ev.alpha, ev.evicted))
        return {"traces": f"{digest_rows(self.train_rows)}/{digest_rows(self.val_rows)}", "labels": labels}

    def loss(self, model, items: list[int], step: int):
        idx = torch.tensor(items)
        x = self.train["features"][idx].to(self.dist.device).float().transpose(0, 1)  # (L, e, K, C, D)
        alpha = self.train["alpha"][idx].to(self.dist.device).transpose(0, 1)
        scores = model(x)
        gen = torch.Generator().manual_seed(self.cfg.seed * 7919 + step * 104729 + self.dist.rank)
        total, _ = pairwise_hinge_loss(scores, alpha, self.cfg.margin, self.cfg.max_pairs, gen)
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
        for name, s in (("random", rnd), ("recency", self.val["positions"].float())):
            m = ranking_metrics(s, self.val["evicted"], self.cfg.eval_max_rows)
            out.update({f"{name}_overlap": m["overlap"], f"{name}_auc": m["auc"]})
        return out

    def evaluate(self, step: int, final: bool) -> dict:
        if not self.dist.is_main or self.val is None:
            return {}
        self.module.eval()
        m = ranking_metrics(self.val_scores(), self.val["evicted"], self.cfg.eval_max_rows)
        res = {"overlap": m["overlap"], "auc": m["auc"], **self.baselines}
        if final and self.cfg.eval_fidelity:
            res["fidelity"] = self.fidelity()
        return res

    def fidelity(self) -> list[dict]:
        from evaluation.fidelity import evaluate_fidelity
        from foresight.policies import make_policy

        rows = self.val_rows[: self.cfg.fidelity_max_traces or None]
        learned = make_policy("learned", scorer=self.module)
        kwargs = {"golden": {"labels": {r["trace_id"]: self.labels[r["trace_id"]] for r in rows}}}
        recs = evaluate_fidelity(
            self.model, [r["input_ids"] for r in rows], [learned, *self.cfg.fidelity_policies], [self.cfg.budget],
            self.cfg.interval, trace_ids=[r["trace_id"] for r in rows], policy_kwargs=kwargs,
        )
        keep = ("policy", "loss_ratio", "delta_ce", "kl", "top1_agreement", "tokens", "traces")
        return [{k: r[k] for k in keep if k in r} for r in recs]


@register_trainer("sl", SLConfig, help="distil golden labels into the scorer (pairwise ranking hinge)")
def run_sl(cfg: SLConfig, resume: bool = False, model=None) -> dict[str, Any]:
    """Extract features, train, validate; write ``<out_dir>/scorer`` and ``<out_dir>/summary.json``.
    ``dagger_rounds > 0`` adds on-policy relabelling rounds (:mod:`training.dagger`)."""
    from training.loop import run_task

    if cfg.dagger_rounds:
        from training.dagger import run_dagger

        return run_dagger(cfg, lambda dist, c: SLTask(c, dist, model=model), resume=resume)

    return run_task(
        cfg, lambda dist: SLTask(cfg, dist, model=model), resume=resume,
        describe=lambda task: (f"{len(task.train_rows)} train traces ({task.num_items()} events), "
                               f"{len(task.val_rows)} held-out traces; scorer input dim "
                               f"{task.scorer_config.input_dim}"),
    )
