"""Stage 2: GRPO refinement of the learned scorer, eviction as a Markov decision process (DESIGN.md section 4).

The MDP: the state is the current cache, an action is the set of ``W`` candidates evicted at an event (one
action per layer and KV head), the policy is the scorer sampling that set, an episode is one chunked replay of a
fixed trace (:func:`foresight.replay`, the same runtime as everything else) with sampled evictions.

* **Policy** (:class:`RolloutPolicy`, a ``learned`` policy whose selection samples): evicted candidates are an
  ordered draw without replacement of ``W`` of the ``C`` candidates with Plackett–Luce logits
  ``-score / temperature`` over *all* drawable candidates (sinks excluded), sampled with Gumbel-top-k; its
  exact log-probability is :func:`training.plackett_luce.log_prob` (see there why the ordered draw).
* **Rollouts** (:func:`collect_rollouts`): the ``G`` rollouts of a trace run as one replay batch of ``G``
  copies, each row with its own Gumbel noise. Per event, layer and head we store the candidates' features (the
  one :class:`~foresight.features.FeatureExtractor`), the drawable mask, the sampled order and its old
  log-probability, so the loss recomputes scores with gradients from exactly the states the rollout saw.
* **Reward** (:func:`episode_rewards`): positions ``>= B + W``, minus the 20% with the highest full-cache
  entropy; ``delta = CE_evicted - CE_full``; ``R = -mean(delta^2 * 1[delta > eta])``. The full-cache CE and
  entropy of a trace are computed once and reused by every rollout.
* **Objective** (:func:`grpo_loss`): group-normalised advantages ``A = (R - mean_G) / (std_G + eps)``; per
  action ``-min(r A, clip(r, 1-eps, 1+eps) A) + beta * k3`` with ``r = exp(logp_new - logp_old)`` and
  ``k3 = exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1`` (KL to the frozen SL scorer, Schulman's k3,
  evaluated on the sampled draws); mean over the actions of a rollout, then over rollouts. ``beta`` follows a
  cosine decay. The optimisation loop, DeepSpeed engine, gradient clipping, checkpoints, resume and logging
  are :mod:`training.loop`'s; one loop step is one optimizer update, and a rollout batch serves
  ``inner_epochs`` consecutive steps.

References: GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300), PPO (Schulman et al. 2017,
https://arxiv.org/abs/1707.06347), ForesightKV's MDP formulation of eviction.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from foresight.errors import ForesightError
from foresight.policies.learned import LearnedPolicy
from training.loop import TrainerConfig
from training.plackett_luce import gumbel_topk, log_prob
from training.registry import register_trainer

# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class GRPOConfig(TrainerConfig):
    """Keys of ``configs/grpo.yaml`` (documented there); validated on construction."""

    RUN_CONTROL: ClassVar[frozenset] = TrainerConfig.RUN_CONTROL | {  # paths: by content, see GRPOTask
        "traces", "init_scorer", "ref_scorer", "eval_before", "eval_traces", "eval_group_size", "eval_seed"}

    out_dir: str = "runs/grpo"
    steps: int = 250
    lr: float = 3e-4
    warmup_steps: int = 0
    micro_batch: int = 1
    checkpoint_every: int = 25
    log_every: int = 1
    model: str = "smollm2-135m"
    dtype: str | None = None
    traces: str = ""
    init_scorer: str = ""
    ref_scorer: str | None = None
    budget: int | None = None
    interval: int | None = None
    max_traces: int = 0
    heldout: float = 0.25
    split_seed: int = 0
    group_size: int = 8
    temperature: float = 0.003  # matched to the SL hinge margin 0.01 (docs/grpo.md)
    inner_epochs: int = 1
    clip_eps: float = 0.2
    beta: float = 0.05
    beta_final: float = 0.005
    beta_decay_steps: int = 0
    eta: float = 1.5
    drop_entropy_frac: float = 0.2
    adv_eps: float = 1e-4
    eval_before: bool = True
    eval_traces: int = 0
    eval_group_size: int = 0
    eval_seed: int = 12345

    def __post_init__(self):
        super().__post_init__()
        if not self.traces or not self.init_scorer:
            raise ValueError("set `traces` (a `foresight trace` directory) and `init_scorer` (an SL scorer "
                             "directory, e.g. runs/sl/run/scorer)")
        if (self.budget is None) != (self.interval is None):
            raise ValueError("set both budget and interval, or neither (then the scorer's are used)")
        if self.budget is not None and not 0 < self.interval < self.budget:
            raise ValueError(f"need 0 < interval < budget, got {self.interval}, {self.budget}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (advantages are normalised within a group), got {self.group_size}")
        if self.inner_epochs < 1:
            raise ValueError(f"inner_epochs must be >= 1, got {self.inner_epochs}")
        for name in ("checkpoint_every", "max_steps_per_run", "steps"):
            v = int(getattr(self, name))
            if v % self.inner_epochs:
                raise ValueError(f"{name} ({v}) must be a multiple of inner_epochs ({self.inner_epochs}) so "
                                 "checkpoints and resumes fall on rollout boundaries")
        if not self.temperature > 0 or not self.clip_eps > 0 or self.adv_eps <= 0:
            raise ValueError("temperature, clip_eps and adv_eps must be > 0")
        if self.beta < 0 or self.beta_final < 0 or self.beta_decay_steps < 0:
            raise ValueError("beta, beta_final and beta_decay_steps must be >= 0")
        if not 0 <= self.drop_entropy_frac < 1:
            raise ValueError(f"drop_entropy_frac must be in [0, 1), got {self.drop_entropy_frac}")
        h = float(self.heldout)
        if not (0 < h < 1 or (h >= 1 and h == int(h))):
            raise ValueError(f"heldout must be a fraction in (0, 1) or a number of problems, got {self.heldout}")
        if self.eval_group_size == 1 or self.eval_group_size < 0 or self.eval_traces < 0:
            raise ValueError("eval_group_size must be 0 (= group_size) or >= 2; eval_traces >= 0")
        if self.max_traces < 0:
            raise ValueError(f"max_traces must be >= 0 (0 = all), got {self.max_traces}")

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.init]


def beta_at(step: int, cfg: GRPOConfig) -> float:
    """KL weight at ``step``: cosine decay from ``beta`` to ``beta_final`` over ``beta_decay_steps`` (0: all)."""
    span = cfg.beta_decay_steps or cfg.steps
    p = min(1.0, step / max(1, span))
    return cfg.beta_final + (cfg.beta - cfg.beta_final) * 0.5 * (1.0 + math.cos(math.pi * p))


# ----------------------------------------------------------------------------------------------------------------
# Reward and advantages
# ----------------------------------------------------------------------------------------------------------------


def reward_positions(entropy_full: torch.Tensor, start: int, drop_frac: float = 0.2) -> torch.Tensor:
    """Bool (N-1,) mask of the positions that count for the reward: ``i >= start`` with a finite entropy,
    minus the ``floor(drop_frac * n)`` of them with the highest full-cache entropy (ties: later positions go)."""
    ent = entropy_full.float()
    idx = torch.arange(ent.shape[-1])
    ok = (idx >= start) & torch.isfinite(ent)
    n = int(ok.sum())
    drop = int(math.floor(drop_frac * n))
    if drop > 0:
        cand = idx[ok]
        order = torch.argsort(ent[ok], stable=True, descending=True)
        ok = ok.clone()
        ok[cand[order[:drop]]] = False
    return ok


def episode_rewards(ce_evicted: torch.Tensor, ce_full: torch.Tensor, positions: torch.Tensor,
                    eta: float = 1.5) -> torch.Tensor:
    """R = -mean over ``positions`` of ``delta^2 * 1[delta > eta]``, ``delta = CE_evicted - CE_full``.

    ``ce_evicted`` (G, N-1), ``ce_full`` (N-1,), ``positions`` bool (N-1,). Returns (G,) fp64-safe fp32.
    """
    if int(positions.sum()) == 0:
        return torch.zeros(ce_evicted.shape[0])
    delta = ce_evicted[:, positions].double() - ce_full[positions].double()[None]
    pen = torch.where(delta > eta, delta * delta, torch.zeros_like(delta))
    return (-pen.mean(-1)).float()


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """``(R - mean) / (std + eps)`` within the last dim (the group), unbiased std as in TRL's GRPOTrainer."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True) if rewards.shape[-1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


def grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor | None,
              advantages: torch.Tensor, action_mask: torch.Tensor | None, clip_eps: float,
              beta: float) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate + k3 KL, averaged over a rollout's actions and then over rollouts.

    ``logp_*`` are (G, A): the log-probability of each of the A sampled actions (eviction draws at every
    (event, layer, head)) of each of the G rollouts; ``advantages`` (G,); ``action_mask`` (A,) or (G, A) bool
    (False: actions after the last scored token, which cannot affect the reward). Returns the scalar loss and
    detached metrics (clip fraction, mean k3, ratio stats).
    """
    if action_mask is None:
        action_mask = torch.ones_like(logp_new, dtype=torch.bool)
    m = action_mask.expand_as(logp_new).to(logp_new.dtype)
    count = m.sum(-1).clamp(min=1)
    log_ratio = logp_new - logp_old
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None].to(logp_new.dtype)
    surr = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    per_action = -surr
    k3 = torch.zeros_like(logp_new)
    if logp_ref is not None:
        d = logp_ref - logp_new
        k3 = torch.exp(d) - d - 1
        if beta:
            per_action = per_action + beta * k3
    loss = ((per_action * m).sum(-1) / count).mean()
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip_eps).to(m.dtype)
        n = m.sum().clamp(min=1)
        metrics = {
            "pg_loss": float(((-surr * m).sum(-1) / count).mean()),
            "kl_k3": float((k3 * m).sum() / n),
            "clip_frac": float((clipped * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
            "log_ratio_absmax": float((log_ratio.abs() * m).max()) if m.any() else 0.0,
        }
    return loss, metrics


# ----------------------------------------------------------------------------------------------------------------
# Rollouts
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class RolloutPolicy(LearnedPolicy):
    """The ``learned`` policy with Plackett–Luce sampled evictions that records every draw (not registered).

    Evicted = ordered Gumbel-top-k draw of ``C - num_keep`` candidates, logits ``-score / temperature``,
    drawable = candidates the runtime left finite (``+inf`` sinks / protected prompt are never drawn). Records
    per (event, layer): features (batch, Hkv, C, D), drawable mask, order (batch, Hkv, W), log-prob (batch, Hkv).
    """

    name: ClassVar[str] = "grpo_rollout"
    replay_only: ClassVar[bool] = True
    selection: str = "sample"
    records: dict = field(default_factory=dict, init=False, repr=False)
    _pending: Any = field(default=None, init=False, repr=False)

    def __post_init__(self):
        super().__post_init__()
        self.on_features = self._keep_features

    def reset(self, batch_size, num_layers, device, num_groups: int = 1, **meta):
        super().reset(batch_size, num_layers, device, num_groups=num_groups, **meta)
        self.records = {}

    def _keep_features(self, view, feats):
        self._pending = feats

    def select(self, scores, num_keep, view):
        if bool((scores == float("-inf")).any()):
            raise ForesightError("GRPO rollouts replay unpadded traces; got padding candidates (-inf scores)")
        free = torch.isfinite(scores)
        k = scores.shape[-1] - num_keep
        logits = (-scores / self.temperature).masked_fill(~free, 0.0)
        order = gumbel_topk(logits, k, free, generator=self._gen)
        lp = log_prob(logits, order, free)
        self.records[(view.event, view.layer_idx)] = (self._pending, free, order, lp)
        self._pending = None
        evicted = torch.zeros_like(free).scatter_(-1, order, True)
        return (~evicted).float().topk(num_keep, dim=-1).indices


@dataclass
class Rollout:
    """G rollouts of one trace.

    ``features`` (E, L, G, Hkv, C, D), ``free`` (E, L, G, Hkv, C) bool, ``order`` (E, L, G, Hkv, W),
    ``logp_old`` (E, L, G, Hkv); ``event_mask`` (E,) bool (event can affect a scored token); ``ce`` (G, N-1);
    ``rewards``/``advantages`` (G,); ``logp_ref`` like ``logp_old`` (filled by the task).
    """

    trace_id: str
    features: torch.Tensor
    free: torch.Tensor
    order: torch.Tensor
    logp_old: torch.Tensor
    event_mask: torch.Tensor
    ce: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    logp_ref: torch.Tensor | None = None

    @property
    def group_size(self) -> int:
        return self.ce.shape[0]


def _flat_actions(t: torch.Tensor) -> torch.Tensor:
    """(E, L, G, Hkv) -> (G, E*L*Hkv)."""
    return t.permute(2, 0, 1, 3).reshape(t.shape[2], -1)


def rollout_log_probs(scorer, ro: Rollout, temperature: float) -> torch.Tensor:
    """Log-probabilities (E, L, G, Hkv) of the recorded draws under ``scorer`` (differentiable)."""
    x = ro.features.transpose(0, 1)  # (L, E, G, Hkv, C, D): the scorer's all-layers form
    scores = scorer(x).transpose(0, 1)  # (E, L, G, Hkv, C)
    logits = (-scores / temperature).masked_fill(~ro.free, 0.0)
    return log_prob(logits, ro.order, ro.free)


def event_ends(length: int, budget: int, interval: int) -> list[int]:
    """Tokens appended when each eviction event of a replay of ``length`` tokens fires."""
    from foresight.runtime import replay_schedule

    return [end for _, end, fire in replay_schedule(length, budget, interval) if fire]


def collect_rollouts(model, scorer, input_ids: list[int], group_size: int, budget: int, interval: int,
                     temperature: float, seed: int, positions: torch.Tensor, ce_full: torch.Tensor, eta: float,
                     adv_eps: float = 1e-4, trace_id: str = "") -> Rollout:
    """Replay one trace ``group_size`` times with sampled evictions; rewards and advantages included."""
    from foresight.runtime import replay

    policy = RolloutPolicy(scorer=scorer, temperature=temperature, seed=seed)
    res = replay(model, [list(map(int, input_ids))] * group_size, policy, budget, interval)
    num_layers = model.config.num_hidden_layers
    events = sorted({e for e, _ in policy.records})
    ends = event_ends(len(input_ids), budget, interval)
    if len(events) != len(ends):
        raise ForesightError(f"trace {trace_id!r}: recorded {len(events)} events, the schedule has {len(ends)}")

    def stack(i):
        return torch.stack([torch.stack([policy.records[(e, layer)][i] for layer in range(num_layers)])
                            for e in events]) if events else None

    feats, free, order, lp = (stack(i) for i in range(4))
    scored_after = torch.flip(torch.cumsum(torch.flip(positions.long(), [0]), 0), [0])  # scored positions >= i
    event_mask = torch.tensor([bool(scored_after[end] > 0) if end < len(scored_after) else False for end in ends],
                              dtype=torch.bool)
    rewards = episode_rewards(res.ce, ce_full, positions, eta)
    return Rollout(trace_id, feats, free, order, lp, event_mask, res.ce, rewards, group_advantages(rewards, adv_eps))


# ----------------------------------------------------------------------------------------------------------------
# The loop.Task
# ----------------------------------------------------------------------------------------------------------------


def _derive_seed(*parts) -> int:
    return int(hashlib.sha1("\x00".join(map(str, parts)).encode()).hexdigest()[:12], 16)


def loss_ratio(ce: torch.Tensor, ce_full: torch.Tensor, start: int) -> tuple[float, float]:
    """Summed CE_evicted and CE_full over positions >= ``start`` (the fidelity loss ratio's numerator/denominator)."""
    sl = slice(start, None)
    ok = torch.isfinite(ce[..., sl]) & torch.isfinite(ce_full[sl])
    return float(ce[..., sl][ok].double().sum()), float(ce_full[sl].expand_as(ce[..., sl])[ok].double().sum())


class GRPOTask:
    """The :class:`training.loop.Task` of GRPO: rollouts, clipped surrogate + KL, held-out reward/loss ratio."""

    def __init__(self, cfg: GRPOConfig, dist, model=None):
        from foresight.fingerprint import check_same_model
        from foresight.scorer import Scorer
        from golden.traces import load_traces
        from training.loop import task_model
        from training.sl import git_commit, split_problems

        self.cfg, self.dist = cfg, dist
        self.model = model = task_model(cfg, dist, model).eval()
        self.module = Scorer.from_pretrained(cfg.init_scorer, model=model, device=model.device)
        self.module.train()
        self.ref = Scorer.from_pretrained(cfg.ref_scorer or cfg.init_scorer, model=model, device=model.device)
        for p in self.ref.parameters():
            p.requires_grad_(False)
        sc = self.module.config
        self.budget = cfg.budget or sc.budget
        self.interval = cfg.interval or sc.interval
        if (self.budget, self.interval) != (sc.budget, sc.interval) and dist.is_main:
            print(f"[foresight] note: scorer trained at B={sc.budget} W={sc.interval}, GRPO runs at "
                  f"B={self.budget} W={self.interval}", flush=True)
        rows = sorted(load_traces(cfg.traces), key=lambda r: r["trace_id"])
        for fp in sorted({r["fingerprint"] for r in rows if r.get("fingerprint")}):  # rollouts replay the traces
            check_same_model(fp, model, f"traces in {cfg.traces}", fix="train on traces generated by this model")
        if cfg.max_traces:
            rows = rows[: cfg.max_traces]
        rows = [r for r in rows if len(r["input_ids"]) > self.budget + self.interval + 1]
        if not rows:
            raise ForesightError(f"no trace of {cfg.traces} is longer than B + W = {self.budget + self.interval}")
        held = split_problems([r["problem_id"] for r in rows], cfg.heldout, cfg.split_seed)
        self.train_rows = [r for r in rows if r["problem_id"] not in held]
        self.val_rows = [r for r in rows if r["problem_id"] in held]
        sl_held = set(sc.provenance.get("heldout_traces", []) or [])
        leak = [r["trace_id"] for r in self.train_rows if sl_held and r["trace_id"] in sl_held]
        if leak and dist.is_main:
            print(f"[foresight] warning: {len(leak)} GRPO training traces were held out by the SL scorer", flush=True)
        self._full: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._buffer: list[Rollout] | None = None
        self.module.config.provenance = {
            **sc.provenance, "grpo": {
                "init_scorer": str(cfg.init_scorer), "traces": str(cfg.traces), "budget": self.budget,
                "interval": self.interval, "train_traces": [r["trace_id"] for r in self.train_rows],
                "heldout_traces": [r["trace_id"] for r in self.val_rows], "git_commit": git_commit(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "config": asdict(cfg)}}

    # -- reference (full cache), computed once per trace ----------------------------------------------------------
    def full_reference(self, row) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-cache (CE, entropy), each (N-1,), cached per trace id."""
        from foresight.runtime import replay

        tid = row["trace_id"]
        if tid not in self._full:
            res = replay(self.model, [list(map(int, row["input_ids"]))], "full", None, self.interval)
            self._full[tid] = (res.ce[0], res.entropy[0])
        return self._full[tid]

    def rollout(self, row, seed: int, group_size: int, scorer=None) -> Rollout:
        ce_full, ent_full = self.full_reference(row)
        pos = reward_positions(ent_full, self.budget + self.interval, self.cfg.drop_entropy_frac)
        scorer = scorer if scorer is not None else self.module
        with torch.no_grad():
            ro = collect_rollouts(self.model, scorer, row["input_ids"], group_size, self.budget, self.interval,
                                  self.cfg.temperature, seed, pos, ce_full, self.cfg.eta, self.cfg.adv_eps,
                                  row["trace_id"])
        return ro

    # -- loop.Task ------------------------------------------------------------------------------------------------
    def num_items(self) -> int:
        return len(self.train_rows)

    def resume_identity(self) -> dict:
        """Content digests of the split's traces and of the initial and reference scorers."""
        from foresight.scorer import CONFIG_NAME, WEIGHTS_NAME
        from training.checkpoint import digest_files, digest_rows

        def scorer(d):
            return digest_files([Path(d) / CONFIG_NAME, Path(d) / WEIGHTS_NAME])

        return {"traces": f"{digest_rows(self.train_rows)}/{digest_rows(self.val_rows)}",
                "init_scorer": scorer(self.cfg.init_scorer),
                "ref_scorer": scorer(self.cfg.ref_scorer or self.cfg.init_scorer)}

    def loss(self, model, items: list[int], step: int):
        cfg = self.cfg
        metrics: dict[str, Any] = {}
        if step % cfg.inner_epochs == 0 or self._buffer is None:
            t0 = time.time()
            batch_idx = step // cfg.inner_epochs
            buf = []
            for i in items:
                row = self.train_rows[i]
                ro = self.rollout(row, _derive_seed(cfg.seed, batch_idx, row["trace_id"], self.dist.rank),
                                  cfg.group_size, scorer=self.module)
                if ro.features is not None and bool(ro.event_mask.any()):
                    with torch.no_grad():
                        ro.logp_ref = rollout_log_probs(self.ref, ro, cfg.temperature)
                    buf.append(ro)
            self._buffer = buf
            metrics["rollout_seconds"] = round(time.time() - t0, 2)
        beta = beta_at(step, cfg)
        total = None
        agg: dict[str, float] = {}
        for ro in self._buffer:
            lp = rollout_log_probs(model, ro, cfg.temperature)
            loss, m = grpo_loss(_flat_actions(lp), _flat_actions(ro.logp_old), _flat_actions(ro.logp_ref),
                                ro.advantages, _event_action_mask(ro), cfg.clip_eps, beta)
            total = loss if total is None else total + loss
            for k, v in m.items():
                agg[k] = agg.get(k, 0.0) + v / len(self._buffer)
        if total is None:  # no trace of this batch reached an event: a zero loss that keeps the graph
            total = sum(p.sum() * 0.0 for p in self.module.parameters())
        else:
            total = total / len(self._buffer)
        rewards = torch.cat([ro.rewards for ro in self._buffer]) if self._buffer else torch.zeros(1)
        metrics.update(agg)
        metrics.update({"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if rewards.numel() > 1
                        else 0.0, "beta": beta, "inner_epoch": step % cfg.inner_epochs})
        return total, metrics

    @torch.no_grad()
    def topk_episode(self, row, scorer=None) -> tuple[float, float, float]:
        """Deterministic top-k replay of ``row`` under ``scorer`` (default: the policy): reward, and the summed
        evicted / full-cache CE of :func:`loss_ratio`."""
        from foresight.policies import make_policy
        from foresight.runtime import replay

        ce_full, ent_full = self.full_reference(row)
        start = self.budget + self.interval
        pos = reward_positions(ent_full, start, self.cfg.drop_entropy_frac)
        pol = make_policy("learned", scorer=self.module if scorer is None else scorer, selection="topk")
        res = replay(self.model, [list(map(int, row["input_ids"]))], pol, self.budget, self.interval)
        return (float(episode_rewards(res.ce, ce_full, pos, self.cfg.eta)[0]), *loss_ratio(res.ce[0], ce_full, start))

    @torch.no_grad()
    def evaluate(self, step: int, final: bool) -> dict:
        """Held-out mean reward and loss ratio under sampling (G rollouts, fixed seeds) and under top-k."""
        if not self.dist.is_main or not self.val_rows:
            return {}
        cfg = self.cfg
        was_training = self.module.training
        self.module.eval()
        rows = self.val_rows[: cfg.eval_traces or None]
        g = cfg.eval_group_size or cfg.group_size
        start = self.budget + self.interval
        r_sample, r_topk, ce_ev, ce_fu, ce_ev_s, ce_fu_s = [], [], 0.0, 0.0, 0.0, 0.0
        for row in tqdm(rows, desc=f"held-out eval (step {step})", unit="trace", dynamic_ncols=True):
            ro = self.rollout(row, _derive_seed(cfg.eval_seed, row["trace_id"]), g, scorer=self.module)
            r_sample.append(float(ro.rewards.mean()))
            a, b = loss_ratio(ro.ce, self.full_reference(row)[0], start)
            ce_ev_s, ce_fu_s = ce_ev_s + a, ce_fu_s + b
            r, a, b = self.topk_episode(row)
            r_topk.append(r)
            ce_ev, ce_fu = ce_ev + a, ce_fu + b
        if was_training:
            self.module.train()
        return {"heldout_reward_sample": sum(r_sample) / len(r_sample),
                "heldout_reward_topk": sum(r_topk) / len(r_topk),
                "heldout_loss_ratio_topk": ce_ev / ce_fu if ce_fu else float("nan"),
                "heldout_loss_ratio_sample": ce_ev_s / ce_fu_s if ce_fu_s else float("nan"),
                "heldout_traces": len(rows), "eval_group_size": g}


def _event_action_mask(ro: Rollout) -> torch.Tensor:
    e, num_layers, _, h = ro.logp_old.shape
    return ro.event_mask[:, None, None].expand(e, num_layers, h).reshape(-1)


@register_trainer("grpo", GRPOConfig, help="refine an SL scorer with GRPO on sampled eviction sets")
def run_grpo(cfg: GRPOConfig, resume: bool = False, model=None) -> dict[str, Any]:
    """Rollouts + clipped surrogate through the shared loop; writes ``<out_dir>/scorer`` and ``summary.json``."""
    from training import checkpoint as ckpt
    from training.loop import run_task

    def evaluate_first(task, logger) -> dict:
        fresh = not (resume and ckpt.latest_step(Path(cfg.out_dir)) is not None)
        if not (cfg.eval_before and fresh):
            return {}
        before = task.evaluate(0, final=False)
        if before:
            logger.log(0, before, "eval")
            print(f"[foresight] before GRPO: {json.dumps(before)}", flush=True)
        return before

    return run_task(
        cfg, lambda dist: GRPOTask(cfg, dist, model=model), resume=resume,
        describe=lambda task: (f"GRPO: {len(task.train_rows)} train traces, {len(task.val_rows)} held-out traces, "
                               f"B={task.budget} W={task.interval} G={cfg.group_size}"),
        before_train=evaluate_first,
    )


__all__ = [
    "GRPOConfig",
    "GRPOTask",
    "Rollout",
    "RolloutPolicy",
    "beta_at",
    "collect_rollouts",
    "episode_rewards",
    "group_advantages",
    "grpo_loss",
    "loss_ratio",
    "reward_positions",
    "rollout_log_probs",
    "run_grpo",
]
