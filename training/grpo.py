"""Stage 2: GRPO refinement of the learned scorer, eviction as a Markov decision process (docs/training.md).

The MDP: the state is the current cache, an action is the set of ``W`` candidates evicted at an event (one
action per layer and KV head), the policy is the scorer sampling that set, an episode is one chunked replay of a
fixed trace (:func:`foresight.replay`, the same runtime as everything else) with sampled evictions.

The pieces, one module each: :mod:`training.grpo_config` (the keys), :mod:`training.rollout` (the rollout
policy: the ``learned`` policy's own Plackett–Luce draw, recorded), :mod:`training.reward` (reward and
advantages), and here the objective and the :class:`training.loop.Task`.

* **Objective** (:func:`grpo_loss`): group-normalised advantages, episode-level ``A = (R - mean_G) / (std_G +
  eps)`` or per-event reward-to-go (``advantage: per_event``); per action ``-min(r A, clip(r, 1-eps, 1+eps) A)
  + beta * k3`` with ``r = exp(logp_new - logp_old)`` and ``k3 = exp(logp_ref - logp_new) - (logp_ref -
  logp_new) - 1`` (KL to the frozen SL scorer, Schulman's k3, evaluated on the sampled draws); mean over the
  actions of a rollout, then over rollouts. ``beta`` follows a cosine decay. The optimisation loop, DeepSpeed
  engine, gradient clipping, checkpoints, resume and logging are :mod:`training.loop`'s; one loop step is one
  optimizer update, and a rollout batch serves ``inner_epochs`` consecutive steps.
* **Held-out evaluation** (:meth:`GRPOTask.evaluate`): mean reward and loss ratio under sampling and top-k,
  and the paired per-trace top-k loss-ratio difference to the SL (reference) scorer with a bootstrap 95%
  interval (:func:`evaluation.stats.paired_bootstrap`).

References: GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300), PPO (Schulman et al. 2017,
https://arxiv.org/abs/1707.06347), ForesightKV's MDP formulation of eviction.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from evaluation.stats import paired_bootstrap
from foresight.errors import ForesightError
from foresight.fingerprint import check_same_model
from foresight.limits import kv_bytes_per_token
from foresight.policies import make_policy
from foresight.runtime import replay
from foresight.scorer import CONFIG_NAME, WEIGHTS_NAME, Scorer, resolve_scorer
from training.digests import digest_files, digest_rows
from training.grpo_config import GRPOConfig, beta_at
from training.loop import check_step_memory, evaluate_before, run_task, task_model
from training.provenance import add_refinement, split_traces
from training.reward import episode_rewards, loss_ratio, reward_positions
from training.rollout import (Rollout, action_advantages, collect_rollouts, event_action_mask, flat_actions,
                              rollout_log_probs)

# ----------------------------------------------------------------------------------------------------------------
# The objective
# ----------------------------------------------------------------------------------------------------------------


def grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor | None,
              advantages: torch.Tensor, action_mask: torch.Tensor | None, clip_eps: float,
              beta: float) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate + k3 KL, averaged over a rollout's actions and then over rollouts.

    ``logp_*`` are (G, A): the log-probability of each of the A sampled actions (eviction draws at every
    (event, layer, head)) of each of the G rollouts; ``advantages`` (G,) per rollout or (G, A) per action
    (per-event reward-to-go); ``action_mask`` (A,) or (G, A) bool
    (False: actions after the last scored token, which cannot affect the reward). Returns the scalar loss and
    detached metrics (clip fraction, mean k3, ratio stats).
    """
    if action_mask is None:
        action_mask = torch.ones_like(logp_new, dtype=torch.bool)
    m = action_mask.expand_as(logp_new).to(logp_new.dtype)
    count = m.sum(-1).clamp(min=1)
    log_ratio = logp_new - logp_old
    ratio = torch.exp(log_ratio)
    adv = (advantages[:, None] if advantages.dim() == 1 else advantages).to(logp_new.dtype)
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
            # the learning signal per action (why GRPO may not move): |A| and the share of actions with A != 0
            "adv_abs_mean": float((adv.abs().expand_as(m) * m).sum() / n),
            "adv_nonzero_frac": float(((adv != 0).expand_as(m).to(m.dtype) * m).sum() / n),
        }
    return loss, metrics


# ----------------------------------------------------------------------------------------------------------------
# The loop.Task
# ----------------------------------------------------------------------------------------------------------------


def _derive_seed(*parts) -> int:
    return int(hashlib.sha1("\x00".join(map(str, parts)).encode()).hexdigest()[:12], 16)


class GRPOData:
    """What GRPO trains and validates on, loaded before the model (:class:`training.loop.TaskData`): the (B, W) it
    refines at (the initial scorer's unless set), the traces longer than B + W sorted by id, cut to
    ``max_traces`` and split by problem, and the fingerprints the traces record (checked against the model by
    :class:`GRPOTask`)."""

    def __init__(self, cfg: GRPOConfig):
        self.cfg = cfg
        sc = Scorer.from_pretrained(cfg.init_scorer).config  # read and checked here, matched to the model later
        if cfg.ref_scorer:  # the KL term feeds it the rollouts' features, which the initial scorer's extractor made
            rc = Scorer.from_pretrained(cfg.ref_scorer).config
            for key in ("fingerprint", "feature_set", "decay"):
                if getattr(rc, key) != getattr(sc, key):
                    raise ForesightError(f"ref_scorer {cfg.ref_scorer}: its {key} {getattr(rc, key)!r} is not "
                                         f"init_scorer's {getattr(sc, key)!r}; the KL term scores the rollouts' "
                                         "features with it, so it must take the same ones")
        self.budget = cfg.budget or sc.budget
        self.interval = cfg.interval or sc.interval
        self.fingerprints, self.train_rows, self.val_rows = split_traces(
            cfg.traces, cfg.max_traces, self.budget, self.interval, cfg.heldout, cfg.split_seed)

    def resume_identity(self) -> dict:
        """Content digests of the split's traces and of the initial and reference scorers."""
        def scorer(d):  # a directory or a shipped scorer's short name, as Scorer.from_pretrained takes it
            d = resolve_scorer(d)
            return digest_files([d / CONFIG_NAME, d / WEIGHTS_NAME])

        return {"traces": f"{digest_rows(self.train_rows)}/{digest_rows(self.val_rows)}",
                "init_scorer": scorer(self.cfg.init_scorer),
                "ref_scorer": scorer(self.cfg.ref_scorer or self.cfg.init_scorer)}


class GRPOTask:
    """The :class:`training.loop.Task` of GRPO: rollouts, clipped surrogate + KL, held-out reward/loss ratio.

    ``data`` (:class:`GRPOData`, loaded here when not given) is checked against the model: traces and scorers
    made by it."""

    def __init__(self, cfg: GRPOConfig, dist, model=None, data: GRPOData | None = None):
        self.cfg, self.dist = cfg, dist
        self.data = data = data if data is not None else GRPOData(cfg)
        self.model = model = task_model(cfg, dist, model).eval()
        self.module = Scorer.from_pretrained(cfg.init_scorer, model=model, device=model.device)
        self.module.train()
        self.ref = Scorer.from_pretrained(cfg.ref_scorer or cfg.init_scorer, model=model, device=model.device)
        for p in self.ref.parameters():
            p.requires_grad_(False)
        sc = self.module.config
        self.budget, self.interval = data.budget, data.interval
        if (self.budget, self.interval) != (sc.budget, sc.interval):
            if dist.is_main:
                print(f"[foresight] note: scorer for B={sc.budget} W={sc.interval}, GRPO refines it at "
                      f"B={self.budget} W={self.interval} (the setting its result records; its recent-query window "
                      f"stays {sc.feature_window})", flush=True)
            for s in (self.module, self.ref):  # both run (and the result is saved) at this run's (B, W), with the
                s.config = s.config.moved_to(self.budget, self.interval)  # features they were trained on
        for fp in data.fingerprints:  # rollouts replay the traces
            check_same_model(fp, model, f"traces in {cfg.traces}", fix="train on traces generated by this model")
        self.train_rows, self.val_rows = data.train_rows, data.val_rows
        check_step_memory(cfg, dist, cfg.group_size * self.rollout_bytes(), f" x group_size={cfg.group_size}",
                          " or group_size")
        sl_held = set(sc.provenance.get("heldout_traces", []) or [])
        leak = [r["trace_id"] for r in self.train_rows if sl_held and r["trace_id"] in sl_held]
        if leak and dist.is_main:
            print(f"[foresight] warning: {len(leak)} GRPO training traces were held out by the SL scorer", flush=True)
        self._full: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._buffer: list[Rollout] | None = None
        self._sl_topk: dict[str, float] = {}  # per-trace top-k loss ratio of the frozen SL (reference) scorer
        self.module.config.temperature = cfg.temperature  # the sampling distribution it is trained for
        self.module.config.provenance = add_refinement(sc.provenance, "grpo", cfg, self.budget, self.interval,
                                                       self.train_rows, self.val_rows)

    def rollout_bytes(self) -> int:
        """One rollout's large tensors on the longest training trace (an estimate, :mod:`foresight.limits`): its KV
        cache of B + W entries and the features its policy records at every event (fp32, every layer and KV head:
        B candidates of the scorer's input width)."""
        sc, fp = self.module.config, self.module.config.fingerprint
        longest = max((len(r["input_ids"]) for r in self.train_rows), default=0)
        events = max(0, longest - self.budget - self.interval) // self.interval + 1
        return (kv_bytes_per_token(self.model) * (self.budget + self.interval)
                + events * fp["num_layers"] * fp["num_kv_heads"] * self.budget * sc.input_dim * 4)

    # -- reference (full cache), computed once per trace ----------------------------------------------------------
    def full_reference(self, row) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-cache (CE, entropy), each (N-1,), cached per trace id."""
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
                                  row["trace_id"], self.cfg.advantage, self.cfg.reward)
        return ro

    # -- loop.Task ------------------------------------------------------------------------------------------------
    def num_items(self) -> int:
        return len(self.train_rows)

    def resume_identity(self) -> dict:
        return self.data.resume_identity()

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
            loss, m = grpo_loss(flat_actions(lp), flat_actions(ro.logp_old), flat_actions(ro.logp_ref),
                                action_advantages(ro), event_action_mask(ro), cfg.clip_eps, beta)
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
        ce_full, ent_full = self.full_reference(row)
        start = self.budget + self.interval
        pos = reward_positions(ent_full, start, self.cfg.drop_entropy_frac)
        pol = make_policy("learned", scorer=self.module if scorer is None else scorer, selection="topk")
        res = replay(self.model, [list(map(int, row["input_ids"]))], pol, self.budget, self.interval)
        reward = episode_rewards(res.ce, ce_full, pos, self.cfg.eta, self.cfg.reward)
        return (float(reward[0]), *loss_ratio(res.ce[0], ce_full, start))

    def sl_topk_ratio(self, row) -> float:
        """Top-k loss ratio of ``row`` under the frozen SL (reference) scorer, computed once per trace."""
        tid = row["trace_id"]
        if tid not in self._sl_topk:
            _, a, b = self.topk_episode(row, scorer=self.ref)
            self._sl_topk[tid] = a / b if b else float("nan")
        return self._sl_topk[tid]

    @torch.no_grad()
    def evaluate(self, step: int, final: bool) -> dict:
        """Held-out mean reward and loss ratio under sampling (G rollouts, fixed seeds) and under top-k, and the
        paired per-trace top-k loss-ratio difference policy - SL (reference) scorer with its bootstrap 95%
        interval (``heldout_vs_sl_*``; negative = the policy evicts better than the SL scorer)."""
        if not self.dist.is_main or not self.val_rows:
            return {}
        cfg = self.cfg
        was_training = self.module.training
        self.module.eval()
        rows = self.val_rows[: cfg.eval_traces or None]
        g = cfg.eval_group_size or cfg.group_size
        start = self.budget + self.interval
        r_sample, r_topk, ce_ev, ce_fu, ce_ev_s, ce_fu_s = [], [], 0.0, 0.0, 0.0, 0.0
        ratio_policy, ratio_sl = [], []
        for row in tqdm(rows, desc=f"held-out eval (step {step})", unit="trace", dynamic_ncols=True):
            ro = self.rollout(row, _derive_seed(cfg.eval_seed, row["trace_id"]), g, scorer=self.module)
            r_sample.append(float(ro.rewards.mean()))
            a, b = loss_ratio(ro.ce, self.full_reference(row)[0], start)
            ce_ev_s, ce_fu_s = ce_ev_s + a, ce_fu_s + b
            r, a, b = self.topk_episode(row)
            r_topk.append(r)
            ce_ev, ce_fu = ce_ev + a, ce_fu + b
            ratio_policy.append(a / b if b else float("nan"))
            ratio_sl.append(self.sl_topk_ratio(row))
        if was_training:
            self.module.train()
        vs_sl = paired_bootstrap(ratio_policy, ratio_sl, seed=cfg.eval_seed)
        return {"heldout_reward_sample": sum(r_sample) / len(r_sample),
                "heldout_reward_topk": sum(r_topk) / len(r_topk),
                "heldout_loss_ratio_topk": ce_ev / ce_fu if ce_fu else float("nan"),
                "heldout_loss_ratio_sample": ce_ev_s / ce_fu_s if ce_fu_s else float("nan"),
                "heldout_vs_sl_mean": vs_sl["mean"], "heldout_vs_sl_ci_low": vs_sl["ci_low"],
                "heldout_vs_sl_ci_high": vs_sl["ci_high"], "heldout_traces": len(rows), "eval_group_size": g}


def run_grpo(cfg: GRPOConfig, resume: bool = False, model=None, overwrite: bool = False) -> dict[str, Any]:
    """Rollouts + clipped surrogate through the shared loop; writes ``<out_dir>/scorer`` and ``summary.json``
    (``overwrite``: replacing an earlier run there)."""
    return run_task(
        cfg, GRPOData, lambda dist, data: GRPOTask(cfg, dist, model=model, data=data), resume=resume,
        describe=lambda task: (f"GRPO: {len(task.train_rows)} train traces, {len(task.val_rows)} held-out traces, "
                               f"B={task.budget} W={task.interval} G={cfg.group_size}"),
        before_train=evaluate_before(cfg, resume, "GRPO"), overwrite=overwrite,
    )


__all__ = ["GRPOConfig", "GRPOData", "GRPOTask", "grpo_loss", "run_grpo"]  # GRPOConfig: for `train grpo`
