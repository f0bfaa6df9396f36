"""``foresight train e2e``: train the scorer on the LM's loss through a relaxed budgeted replay (docs/training.md).

Imitation (``train sl``) ranks candidates by the oracle's proxy (future attention); here the scorer is trained on
what its evictions cost the frozen LM. Each training trace is replayed by :func:`foresight.replay` with
``grad=True`` under :class:`training.e2e_policy.RelaxedLearnedPolicy`: the ``learned`` policy's own trajectory, with
every eviction made soft (log keep-probabilities from the scores, added to the attention logits of the entries), so
the loss reaches the scorer's weights. The loss (:func:`relaxed_loss`) is the LM's cross-entropy on the trace's
next tokens at positions ``>= B + W`` (``objective: ce``) or the KL from the full cache's distribution at those
positions (``objective: kl``), pooled over the positions of a micro-batch. The LM is frozen; only the scorer's
weights train (its standardisation statistics are buffers and stay).

Same machinery as the other trainers (:mod:`training.loop`): DeepSpeed, seeded data order, safetensors checkpoints
and ``--resume``, ``metrics.jsonl``, held-out split by problem. **Held-out evaluation** (:meth:`E2ETask.evaluate`):
the hard ``learned`` replay as it deploys (top-k with the scorer's recorded defaults) of the current and the initial
scorer, the pooled loss ratio of each and their paired per-trace difference with a bootstrap 95% interval.
"""

from __future__ import annotations

from typing import Any

import torch

from evaluation.fidelity import ReferenceLogProbs
from evaluation.stats import paired_bootstrap
from foresight.errors import ForesightError
from foresight.fingerprint import check_same_model
from foresight.limits import kv_bytes_per_token
from foresight.policies import make_policy
from foresight.runtime import replay
from foresight.scorer import CONFIG_NAME, WEIGHTS_NAME, Scorer, resolve_scorer
from training.adapt_student import StudentKL, full_reference
from training.digests import digest_files, digest_rows
from training.e2e_config import E2EConfig
from training.e2e_policy import RelaxedLearnedPolicy
from training.loop import check_step_memory, evaluate_before, run_task, task_model
from training.provenance import add_refinement, split_traces
from training.reward import loss_ratio


def relaxed_loss(model, scorer: Scorer, seq: list[int], budget: int, interval: int, tau: float,
                 objective: str = "ce", ref: ReferenceLogProbs | None = None,
                 engine: str = "auto") -> tuple[torch.Tensor, StudentKL]:
    """The summed objective of one trace under the relaxed eviction (with graph to ``scorer``) and the hook that
    summed it (``count`` positions ``>= B + W``, ``ce``, and ``kl`` where there is a reference). ``ref``: the full
    cache's log-probs, computed here for ``objective="kl"`` when not given; ``ce`` needs none (the reference holds
    every position's whole distribution, tens of MB a trace)."""
    first = budget + interval
    if ref is None and objective == "kl":
        ref = full_reference(model, seq, first, interval)[0]
    hook = StudentKL(ref, first, seq, with_ce=True)
    policy = RelaxedLearnedPolicy(scorer=scorer, tau=tau)
    # the tokens before the first event see no bias: their activations need no gradient
    replay(model, [seq], policy, budget, interval, on_logits=hook, grad=True, grad_from=first, engine=engine)
    total = hook.ce if objective == "ce" else hook.kl
    if not isinstance(total, torch.Tensor):  # no position after the first event
        total = sum(p.sum() * 0.0 for p in scorer.parameters())
    return total, hook


class E2EData:
    """What e2e trains and validates on, loaded before the model (:class:`training.loop.TaskData`): the traces
    longer than B + W + 1 (the initial scorer's B, W) sorted by id, cut to ``max_traces`` and split by problem as
    ``train sl`` splits them."""

    def __init__(self, cfg: E2EConfig):
        self.cfg = cfg
        sc = Scorer.from_pretrained(cfg.init_scorer).config  # read and checked here, matched to the model later
        self.budget, self.interval = sc.budget, sc.interval
        self.fingerprints, self.train_rows, self.val_rows = split_traces(
            cfg.traces, cfg.max_traces, self.budget, self.interval, cfg.heldout, cfg.split_seed)
        if not self.train_rows:
            raise ForesightError(f"heldout={cfg.heldout} leaves no training trace of {cfg.traces}")

    def resume_identity(self) -> dict:
        d = resolve_scorer(self.cfg.init_scorer)
        return {"traces": f"{digest_rows(self.train_rows)}/{digest_rows(self.val_rows)}",
                "init_scorer": digest_files([d / CONFIG_NAME, d / WEIGHTS_NAME])}


class E2ETask:
    """The :class:`training.loop.Task` of loss-aware scorer training (module docstring)."""

    def __init__(self, cfg: E2EConfig, dist, model=None, data: E2EData | None = None):
        self.cfg, self.dist = cfg, dist
        self.data = data = data if data is not None else E2EData(cfg)
        self.model = model = task_model(cfg, dist, model).eval()  # frozen (load_model): only the scorer trains
        self.module = Scorer.from_pretrained(cfg.init_scorer, model=model, device=model.device)
        self.init = Scorer.from_pretrained(cfg.init_scorer, model=model, device=model.device).requires_grad_(False)
        if model.dtype == torch.float64:  # fp64 models (tests): the scorer in fp64 too
            self.module.double(), self.init.double()
        self.module.train()
        for fp in data.fingerprints:
            check_same_model(fp, model, f"traces in {cfg.traces}", fix="train on traces generated by this model")
        self.budget, self.interval = data.budget, data.interval
        self.train_rows, self.val_rows = data.train_rows, data.val_rows
        longest = min(max(len(r["input_ids"]) for r in self.train_rows), cfg.max_tokens or 1 << 62)
        vocab = model.get_input_embeddings().num_embeddings
        check_step_memory(cfg, dist, longest * (kv_bytes_per_token(model) + 2 * 4 * vocab))
        self._full_ce: dict[str, torch.Tensor] = {}
        self._init_ratio: dict[str, float] = {}
        sc = self.module.config
        sc.provenance = add_refinement(sc.provenance, "e2e", cfg, self.budget, self.interval, self.train_rows,
                                       self.val_rows)

    def _seq(self, row) -> list[int]:
        ids = list(map(int, row["input_ids"]))
        return ids[: self.cfg.max_tokens or None]

    # -- loop.Task ------------------------------------------------------------------------------------------------
    def num_items(self) -> int:
        return len(self.train_rows)

    def resume_identity(self) -> dict:
        return self.data.resume_identity()

    def loss(self, model, items: list[int], step: int) -> tuple[torch.Tensor, dict]:
        cfg = self.cfg
        scorer = getattr(model, "module", model)
        total, count, ce, kl = None, 0, 0.0, 0.0
        for i in items:
            row = self.train_rows[i]
            # the reference (objective kl) is recomputed per step, not kept: one trace's is tens of MB, every trace's
            # would grow without bound over a run
            part, hook = relaxed_loss(self.model, scorer, self._seq(row), self.budget, self.interval, cfg.tau,
                                      cfg.objective)
            total = part if total is None else total + part
            count += hook.count
            ce += float(hook.ce.detach()) if isinstance(hook.ce, torch.Tensor) else 0.0
            kl += float(hook.kl.detach()) if isinstance(hook.kl, torch.Tensor) else 0.0
        if count == 0:
            return total * 0.0, {"positions": 0}
        metrics = {"relaxed_ce": ce / count, "positions": count}
        if cfg.objective == "kl":
            metrics["relaxed_kl"] = kl / count
        return total / count, metrics

    @torch.no_grad()
    def _hard(self, row, scorer) -> tuple[float, float]:
        """Summed hard ``learned`` CE (as deployed: top-k with the scorer's recorded defaults) and full-cache CE over
        positions ``>= B + W`` of ``row``."""
        seq, tid = self._seq(row), row["trace_id"]
        if tid not in self._full_ce:
            self._full_ce[tid] = replay(self.model, [seq], "full", None, self.interval).ce[0]
        res = replay(self.model, [seq], make_policy("learned", scorer=scorer), self.budget, self.interval)
        return loss_ratio(res.ce[0], self._full_ce[tid], self.budget + self.interval)

    @torch.no_grad()
    def evaluate(self, step: int, final: bool) -> dict:
        """Held-out pooled hard loss ratio of the current and the initial scorer, and their paired per-trace
        difference (current - initial) with a bootstrap 95% interval (negative: the trained scorer evicts better)."""
        if not self.dist.is_main or not self.val_rows:
            return {}
        rows = self.val_rows[: self.cfg.eval_traces or None]
        was_training = self.module.training
        ev = fu = ev0 = 0.0
        now, init = [], []
        for row in rows:
            a, b = self._hard(row, self.module)
            ev, fu = ev + a, fu + b
            now.append(a / b if b else float("nan"))
            tid = row["trace_id"]
            if tid not in self._init_ratio:
                a0, b0 = self._hard(row, self.init)
                self._init_ratio[tid] = a0 / b0 if b0 else float("nan")
            init.append(self._init_ratio[tid])
            ev0 += init[-1] * b
        if was_training:
            self.module.train()
        diff = paired_bootstrap(now, init, seed=self.cfg.seed)
        return {"heldout_loss_ratio": ev / fu if fu else float("nan"),
                "heldout_loss_ratio_init": ev0 / fu if fu else float("nan"),
                "heldout_vs_init_mean": diff["mean"], "heldout_vs_init_ci_low": diff["ci_low"],
                "heldout_vs_init_ci_high": diff["ci_high"], "heldout_traces": len(rows)}


def run_e2e(cfg: E2EConfig, resume: bool = False, model=None, overwrite: bool = False) -> dict[str, Any]:
    """Loss-aware training through the shared loop; writes ``<out_dir>/scorer`` and ``summary.json``."""
    return run_task(
        cfg, E2EData, lambda dist, data: E2ETask(cfg, dist, model=model, data=data), resume=resume,
        describe=lambda task: (f"e2e: {len(task.train_rows)} train traces, {len(task.val_rows)} held-out traces, "
                               f"B={task.budget} W={task.interval} tau={cfg.tau} objective={cfg.objective}"),
        before_train=evaluate_before(cfg, resume, "e2e"), overwrite=overwrite,
    )


__all__ = ["E2EConfig", "E2EData", "E2ETask", "relaxed_loss", "run_e2e"]
