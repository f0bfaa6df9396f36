"""``foresight train adapt``: adapt the model to its evicted cache with a LoRA adapter (docs/training.md, adaptation).

A learned policy adapts the cache to the model; here the model adapts to its cache. A peft LoRA adapter on the
attention projections of the frozen LM is trained so that the LM *under an eviction policy* (any evicting
decode-time policy; ``learned`` with its scorer frozen) predicts what the same LM predicts with its adapter
disabled and a full cache: loss = KL(p_full || p_evicted) over positions ``>= B + W`` of training traces, plus an
optional CE term, through the budgeted runtime's own chunked replay with gradients
(:mod:`training.adapt_student`). Same machinery as SL and GRPO (:mod:`training.loop`): DeepSpeed, seeded data
order, safetensors checkpoints and ``--resume``, ``metrics.jsonl`` and wandb, held-out split by problem.

**Held-out evaluation** (:meth:`AdaptTask.evaluate`, through :mod:`evaluation.adapted`, which
``benchmarks/adapt_eval.py`` shares): :func:`evaluation.fidelity.evaluate_fidelity` on the
held-out traces for every ``eval_policies`` entry, once with the adapter disabled (``base``, computed once) and
once enabled (``adapted``): loss ratio, KL and top-1 agreement of each, the paired per-trace loss-ratio difference
adapted - base with a bootstrap 95% interval, the full-cache CE of the adapted model relative to the base
(``full_ce_ratio``: the adapter must not make the uncompressed model worse), and the training objective itself
(KL of the adapted, evicted model to the base, full-cache model).

**Output** ``<out_dir>/adapter/``: peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``,
loadable by ``PeftModel.from_pretrained`` and by any job's ``--adapter``) plus ``foresight_adapter.json``: the
base model's fingerprint and the policy, B, W (and scorer) it was trained under.

Why not TRL's ``GKDTrainer``: see docs/training.md ("Adapting the model to its evicted cache").
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from evaluation.adapted import compare_adapted, fidelity_by_policy
from evaluation.policies import make_factory
from foresight.adapters import (ADAPTER_WEIGHTS, TRAINING_META, AdapterError, adapter_identity, check_base,
                                does_not_fit, quiet_peft)
from foresight.atomic import atomic_directory
from foresight.errors import ForesightError
from foresight.fingerprint import check_same_model, file_sha256, model_fingerprint
from foresight.limits import kv_bytes_per_token
from foresight.scorer import CONFIG_NAME, WEIGHTS_NAME, Scorer
from golden.traces import load_traces
from training.adapt_config import AdaptConfig
from training.adapt_student import EvictedStudent, distillation_loss
from training.digests import digest_files, digest_rows
from training.loop import check_step_memory, evaluate_before, run_task, task_model
from training.provenance import split_problems, stamp


def start_fingerprint(base, init_adapter: str | None, scorer: Scorer) -> dict:
    """The model a frozen ``scorer`` must have been trained for: the base model, or, when training starts from
    ``init_adapter`` and the scorer records an adapter, the base model with that very adapter (the student's first
    step). The second is alternation (docs/training.md, adaptation): a scorer trained for the adapted model
    (``foresight train sl adapter=...``), and the adapter trained on under it; the student then carries that
    adapter's identity in its fingerprint for the whole run (it *is* that model, trained on), so the runtime's
    per-replay scorer check agrees, the trainer's own base-side evaluation under ``learned`` included (it evicts the
    base with the same scorer; ``benchmarks/adapt_eval.py --adapted-scorer`` measures the system against the base
    with its own scorer). Any other scorer is refused."""
    fp = model_fingerprint(base)
    if init_adapter and scorer.config.fingerprint.get("adapter"):
        fp = {**fp, "adapter": adapter_identity(init_adapter)}
    return fp


def fingerprints(rows: list[dict]) -> list[str]:
    """The model fingerprints that the trace rows record, once each."""
    return sorted({r["fingerprint"] for r in rows if r.get("fingerprint")})


def check_base_model(fps: list[str], path, base, fix: str) -> None:
    """Refuse the traces of ``path`` (their :func:`fingerprints`) unless the base model made them (the teacher)."""
    for fp in fps:
        check_same_model(fp, base, f"traces in {path}", fix=fix)


def base_model_traces(path, base, fix: str) -> list[dict]:
    """The traces of ``path`` sorted by trace id, refused unless the base model made them (it is the teacher)."""
    rows = sorted(load_traces(path), key=lambda r: r["trace_id"])
    check_base_model(fingerprints(rows), path, base, fix)
    return rows


def longer_than(rows: list[dict], first: int, where) -> list[dict]:
    """The rows with a position to score after the first event (``> B + W + 1`` tokens); none is an error."""
    rows = [r for r in rows if len(r["input_ids"]) > first + 1]
    if not rows:
        raise ForesightError(f"no trace of {where} is longer than B + W = {first}")
    return rows


class AdaptData:
    """What adaptation trains and validates on, loaded before the model (:class:`training.loop.TaskData`): the
    traces longer than B + W sorted by id and cut to ``max_traces``, split by problem or with ``heldout_traces`` as
    the held-out set (of other problems). :class:`AdaptTask` checks that the base model made them."""

    def __init__(self, cfg: AdaptConfig):
        self.cfg = cfg
        first = cfg.budget + cfg.interval
        rows = sorted(load_traces(cfg.traces), key=lambda r: r["trace_id"])
        self.made_by = [(cfg.traces, fingerprints(rows), "adapt on traces generated by the base model")]
        rows = longer_than(rows[: cfg.max_traces or None], first, cfg.traces)
        if cfg.heldout_traces:
            self.train_rows, self.val_rows = rows, self._heldout_rows(rows, first)
        else:
            held = split_problems([r["problem_id"] for r in rows], cfg.heldout, cfg.split_seed)
            self.train_rows = [r for r in rows if r["problem_id"] not in held]
            self.val_rows = [r for r in rows if r["problem_id"] in held]

    def _heldout_rows(self, train_rows, first: int) -> list:
        """The traces of ``heldout_traces`` longer than B + W, of problems that no training trace comes from (a
        shared problem would make the held-out numbers in-sample)."""
        path = self.cfg.heldout_traces
        rows = sorted(load_traces(path), key=lambda r: r["trace_id"])
        self.made_by.append((path, fingerprints(rows), "evaluate on traces generated by the base model"))
        shared = sorted({r["problem_id"] for r in rows} & {r["problem_id"] for r in train_rows})
        if shared:
            raise ForesightError(f"heldout_traces {path}: {len(shared)} of its problems also occur in "
                                 f"{self.cfg.traces} (e.g. {shared[0]!r}); held-out problems must never be trained on")
        return longer_than(rows, first, f"heldout_traces {path}")

    def check_base(self, base) -> None:
        """Refuse traces (training or held out) that ``base`` did not make."""
        for path, fps, fix in self.made_by:
            check_base_model(fps, path, base, fix)

    def resume_identity(self) -> dict:
        """Content digests of the split's traces, the initial adapter and the frozen scorer (when a policy uses it)."""
        cfg = self.cfg
        out = {"traces": f"{digest_rows(self.train_rows)}/{digest_rows(self.val_rows)}"}
        if cfg.init_adapter:
            out["init_adapter"] = digest_files([Path(cfg.init_adapter) / ADAPTER_WEIGHTS])
        if cfg.scorer and "learned" in (cfg.policy, *cfg.eval_policies):
            out["scorer"] = digest_files([cfg.scorer_dir / CONFIG_NAME, cfg.scorer_dir / WEIGHTS_NAME])
        return out


class AdaptTask:
    """The :class:`training.loop.Task` of eviction-aware adaptation: a LoRA student distilled from its own base.

    ``model``: in-process callers (tests) pass a freshly loaded model; LoRA layers are injected into it. ``data``
    (:class:`AdaptData`, loaded here when not given) is checked against it.
    """

    artefact = "adapter"

    def __init__(self, cfg: AdaptConfig, dist, model=None, data: AdaptData | None = None):
        # Imported here: peft takes seconds to import, and `foresight --help` imports every trainer module.
        from peft import LoraConfig, PeftModel, get_peft_model

        self.cfg, self.dist = cfg, dist
        self.data = data = data if data is not None else AdaptData(cfg)
        base = task_model(cfg, dist, model).eval()
        if isinstance(base, PeftModel) or getattr(base, "peft_config", None):
            raise ForesightError("train adapt needs a model without LoRA layers (load a fresh one)")
        self.base_fingerprint = model_fingerprint(base)
        if cfg.init_adapter:
            check_base(cfg.init_adapter, base)  # made for this very base model, before any work
        data.check_base(base)
        self.scorer = None
        if "learned" in (cfg.policy, *cfg.eval_policies):
            self.scorer = Scorer.from_pretrained(cfg.scorer, device=base.device).eval()
            start = start_fingerprint(base, cfg.init_adapter, self.scorer)
            self.scorer.check_compatible(start)
            self.scorer.requires_grad_(False)  # frozen: only the adapter trains
            if "adapter" in start:  # alternation: the runtime's scorer check sees the init adapter's model
                base.config.foresight_adapter = start["adapter"]
        self.train_rows, self.val_rows = data.train_rows, data.val_rows
        # a trace's step keeps, for its backward, its cache and the student's and teacher's logits at every position
        longest = max((len(r["input_ids"]) for r in self.train_rows), default=0)
        vocab = base.get_input_embeddings().num_embeddings
        check_step_memory(cfg, dist, longest * (kv_bytes_per_token(base) + 2 * 4 * vocab))
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.target_modules), bias="none")
        try:
            with quiet_peft():
                self.peft_model = get_peft_model(base, lora)  # B = 0: the first step's student is the base model
        except ValueError as exc:
            raise ForesightError(f"target_modules {cfg.target_modules}: {exc}") from None
        if cfg.init_adapter:
            self._load_init_adapter()
        self.lm = self.peft_model.get_base_model()
        self.module = EvictedStudent(self.peft_model, cfg.build_policy(self.scorer), cfg.budget, cfg.interval,
                                     cfg.sinks, cfg.truncate_backprop)
        self._base_eval: dict | None = None

    def _load_init_adapter(self) -> None:
        """Start the LoRA weights from ``init_adapter`` (its shape was checked by the config): every LoRA tensor of
        the model is loaded, none is left at its random/zero initialisation and none of the file is ignored."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        path = Path(self.cfg.init_adapter)
        try:
            weights = load_file(str(path / ADAPTER_WEIGHTS))
            result = set_peft_model_state_dict(self.peft_model, weights)
        except (RuntimeError, ValueError, OSError) as exc:
            raise does_not_fit(path, exc, "init_adapter") from None
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing or result.unexpected_keys:
            raise AdapterError(f"init_adapter {path} does not fit this model: "
                               + (f"no weights for {missing[0]}" if missing else
                                  f"weights for no module: {result.unexpected_keys[0]}"))

    # -- loop.Task ------------------------------------------------------------------------------------------------
    def num_items(self) -> int:
        return len(self.train_rows)

    def resume_identity(self) -> dict:
        return self.data.resume_identity()

    def loss(self, model, items: list[int], step: int) -> tuple[torch.Tensor, dict]:
        seqs = [list(map(int, self.train_rows[i]["input_ids"])) for i in items]
        cfg = self.cfg
        return distillation_loss(model, self.peft_model, self.lm, seqs, cfg.budget, cfg.interval, cfg.sinks,
                                 cfg.ce_weight, cfg.anchor_weight)

    def _fidelity(self, rows, policies) -> dict[str, dict]:
        cfg = self.cfg
        factory = make_factory(model=self.lm, scorer=cfg.scorer, interval=cfg.interval,
                               policy_kwargs={cfg.policy: dict(cfg.policy_kwargs)})
        return fidelity_by_policy(self.lm, rows, policies, cfg.budget, cfg.interval, cfg.sinks, factory)

    @torch.no_grad()
    def evaluate(self, step: int, final: bool) -> dict:
        """Held-out fidelity of the base (adapter disabled) and adapted model per policy, their paired difference,
        the full-cache CE ratio adapted / base and the held-out training objective (see the module docstring)."""
        if not self.dist.is_main or not self.val_rows:
            return {}
        cfg = self.cfg
        rows = self.val_rows[: cfg.eval_traces or None]
        policies = list(dict.fromkeys([cfg.policy, *cfg.eval_policies]))
        was_training = self.module.training
        self.module.eval()
        if self._base_eval is None:
            with self.peft_model.disable_adapter():
                self._base_eval = self._fidelity(rows, policies)
        adapted = self._fidelity(rows, policies)
        _, objective = distillation_loss(self.module, self.peft_model, self.lm,
                                         [list(map(int, r["input_ids"])) for r in rows], cfg.budget, cfg.interval,
                                         cfg.sinks)
        if was_training:
            self.module.train()
        return {"heldout_traces": len(rows), "heldout_kl_to_base": objective.get("kl"),
                **compare_adapted(self._base_eval, adapted, seed=cfg.seed, prefix="heldout_")}

    # -- the artefact ---------------------------------------------------------------------------------------------
    def training_meta(self) -> dict:
        cfg = self.cfg
        return {"format": "foresight-adapter/1", "base_fingerprint": self.base_fingerprint, "policy": cfg.policy,
                "policy_kwargs": {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                                  for k, v in cfg.policy_kwargs.items()},
                "budget": cfg.budget, "interval": cfg.interval, "sinks": cfg.sinks,
                "scorer": str(cfg.scorer) if cfg.policy == "learned" else None,
                "scorer_sha256": (file_sha256(cfg.scorer_dir / WEIGHTS_NAME) if cfg.policy == "learned"
                                  else None),  # `foresight export` pairs the adapter with this very scorer
                "init_adapter": ({"path": str(cfg.init_adapter),
                                  "sha256": file_sha256(Path(cfg.init_adapter) / ADAPTER_WEIGHTS)}
                                 if cfg.init_adapter else None),
                "traces": cfg.traces, "train_traces": [r["trace_id"] for r in self.train_rows],
                "heldout_traces": [r["trace_id"] for r in self.val_rows], **stamp(), "config": asdict(cfg)}

    def save_artefact(self, path: Path) -> Path:
        """Write the adapter in peft's format plus ``foresight_adapter.json`` to ``path`` atomically
        (:func:`~foresight.atomic.atomic_directory`)."""
        with atomic_directory(path) as tmp:
            with quiet_peft():
                self.peft_model.save_pretrained(str(tmp), save_embedding_layers=False)
            (tmp / TRAINING_META).write_text(json.dumps(self.training_meta(), indent=1, default=str) + "\n")
        return Path(path)


def run_adapt(cfg: AdaptConfig, resume: bool = False, model=None, overwrite: bool = False) -> dict[str, Any]:
    """KL distillation of the LM under eviction into a LoRA adapter; writes ``<out_dir>/adapter`` and
    ``summary.json`` (``overwrite``: replacing an earlier run there)."""
    return run_task(
        cfg, AdaptData, lambda dist, data: AdaptTask(cfg, dist, model=model, data=data), resume=resume,
        describe=lambda task: (f"adapt: {len(task.train_rows)} train traces, {len(task.val_rows)} held-out traces, "
                               f"policy {cfg.policy} B={cfg.budget} W={cfg.interval}, LoRA r={cfg.lora_r} on "
                               f"{', '.join(cfg.target_modules)} "
                               f"({sum(p.numel() for p in task.module.parameters()):,} weights)"),
        before_train=evaluate_before(cfg, resume), overwrite=overwrite,
    )


__all__ = ["AdaptConfig", "AdaptData", "AdaptTask", "run_adapt"]
