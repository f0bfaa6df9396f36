"""The student of ``foresight train adapt``: a LoRA-adapted LM whose forward is a budgeted chunked replay with
gradients, and the KL distillation loss to the same LM with its adapter disabled and a full cache (docs/training.md, adaptation).

* **Teacher** (:func:`teacher_log_probs`): the LM with ``disable_adapter()`` (one model in memory) replays the
  trace with the full cache under inference mode; its log-probs at positions ``>= B + W`` are kept
  (:class:`evaluation.fidelity.ReferenceLogProbs`, the reference ``eval fidelity`` uses).
* **Student** (:class:`EvictedStudent`): the same LM with its adapter on replays the trace through
  :func:`foresight.replay` with ``grad=True``: the same schedule, cache and policy as every other job, with the
  eviction decisions and the policy's statistics taken without gradient (a ``learned`` policy's scorer stays
  frozen) and the cache keeping its entries out of place, so the loss reaches the LoRA weights through every
  kept key and value (optionally only within a piece, ``truncate_backprop``).
* **Loss** (:class:`StudentKL`): ``KL(p_full || p_evicted)`` summed over positions ``>= B + W`` (the formula of
  :func:`evaluation.fidelity.kl_and_agreement`), plus ``ce_weight`` times the student's cross-entropy on the
  trace, plus ``anchor_weight`` times ``KL(p_full || p_adapted,full)`` (the adapted model with the full cache,
  same positions: the anchor that keeps the uncompressed model where it was); divided by the number of positions
  of the micro-batch (pooled, as ``eval fidelity`` pools its KL).

The module DeepSpeed optimises and the checkpoints store holds only the LoRA weights (shared with the LM, not a
copy): the base weights and the scorer are never parameters of the optimiser and receive no gradient.

References: knowledge distillation (Hinton, Vinyals & Dean 2015, https://arxiv.org/abs/1503.02531) with the
full-cache model as its own teacher; LoRA (Hu et al. 2021, https://arxiv.org/abs/2106.09685); Dynamic Memory
Sparsification (Łańcucki et al. 2025, https://arxiv.org/abs/2506.05345) and kvpress's compression-restoring
LoRA adapters adapt a model to a compressed cache the same way.
"""

from __future__ import annotations

import torch

from evaluation.fidelity import ReferenceLogProbs, kl_and_agreement
from foresight.policies import EvictionPolicy
from foresight.runtime import ReplayResult, replay


def _key(name: str) -> str:
    return name.replace(".", "-")  # ParameterDict keys may not contain dots


class EvictedStudent(torch.nn.Module):
    """The LoRA weights of ``peft_model`` as one module; ``forward`` replays a trace under eviction with gradients.

    Parameters
    ----------
    peft_model
        A :class:`peft.PeftModel` (its LoRA weights trainable, the base frozen). It is referenced, not registered:
        ``parameters()`` / ``state_dict()`` are the LoRA weights only.
    policy
        The eviction policy the student runs under (frozen: it has no parameters here).
    budget, interval, sinks
        B, W and the never-evicted first positions.
    truncate_backprop
        Detach the cached keys/values after every replay piece (gradients flow within a piece only).
    """

    def __init__(self, peft_model, policy: EvictionPolicy, budget: int, interval: int, sinks: int = 0,
                 truncate_backprop: bool = False):
        super().__init__()
        object.__setattr__(self, "peft_model", peft_model)
        object.__setattr__(self, "lm", peft_model.get_base_model())  # a transformers model with LoRA layers
        self.lora = torch.nn.ParameterDict({_key(n): p for n, p in self.lm.named_parameters() if p.requires_grad})
        if not len(self.lora):
            raise ValueError("the peft model has no trainable LoRA weights")
        self.policy, self.budget, self.interval, self.sinks = policy, budget, interval, sinks
        self.truncate_backprop = truncate_backprop

    def train(self, mode: bool = True):
        """Train mode switches the LoRA dropout only; the LM itself stays in eval mode (no other dropout)."""
        super().train(mode)
        for name, m in self.lm.named_modules():
            if name.split(".")[-1] == "lora_dropout":
                m.train(mode)
        return self

    def forward(self, sequence: list[int], on_logits, full: bool = False) -> ReplayResult:
        """Replay ``sequence`` under the policy with the adapter on (``full``: with the full cache instead, for the
        anchor term); while autograd is enabled (training, not under ``no_grad``) ``on_logits`` receives each
        piece's logits with their graph."""
        grad = torch.is_grad_enabled()
        if full:  # nothing is evicted: pieces of FULL_PIECE tokens (one forward and backward each) instead of W
            return replay(self.lm, [sequence], "full", None, self.interval, sinks=self.sinks, on_logits=on_logits,
                          grad=grad)
        return replay(self.lm, [sequence], self.policy, self.budget, self.interval, sinks=self.sinks,
                      on_logits=on_logits, grad=grad, truncate_backprop=grad and self.truncate_backprop)

    def lora_state(self) -> dict[str, torch.Tensor]:
        """``{LM parameter name: tensor}`` of the LoRA weights (the names peft's state dict uses inside)."""
        return {n: p.detach() for n, p in self.lm.named_parameters() if p.requires_grad}


def full_reference(lm, sequence: list[int], first: int, interval: int,
                   sinks: int = 0) -> tuple[ReferenceLogProbs, torch.Tensor]:
    """The full cache's log-probs of ``lm`` at positions ``>= first`` of one trace (fp64 for an fp64 model, else
    fp32), and its per-position CE (N-1,). The full cache evicts nothing, so the sequence is fed in pieces of
    :data:`foresight.runtime.FULL_PIECE` tokens, as ``eval fidelity`` feeds its reference."""
    ref = ReferenceLogProbs(first, len(sequence), torch.float64 if lm.dtype == torch.float64 else torch.float32)
    res = replay(lm, [sequence], "full", None, interval, sinks=sinks, on_logits=ref)
    return ref, res.ce[0]


def teacher_log_probs(peft_model, lm, sequence: list[int], first: int, interval: int,
                      sinks: int = 0) -> tuple[ReferenceLogProbs, torch.Tensor]:
    """:func:`full_reference` of the LM with its adapter disabled (the teacher: one model in memory)."""
    with peft_model.disable_adapter():
        return full_reference(lm, sequence, first, interval, sinks)


class StudentKL:
    """``on_logits`` hook of the student replay: sums KL(p_full || p_evicted) (and the CE of the trace's next
    tokens when ``with_ce``) over positions ``>= first``, keeping the graph. Without ``ref`` it sums the CE alone
    (``with_ce`` required; ``kl`` stays 0)."""

    def __init__(self, ref: ReferenceLogProbs | None, first: int, sequence: list[int], with_ce: bool = False):
        if ref is None and not with_ce:
            raise ValueError("StudentKL without a reference sums the CE only: pass with_ce=True")
        self.ref, self.first, self.with_ce = ref, first, with_ce
        self.n = len(sequence)
        self.targets = torch.tensor(sequence[1:], dtype=torch.long)
        self.kl: torch.Tensor | float = 0.0
        self.ce: torch.Tensor | float = 0.0
        self.agree = 0.0
        self.count = 0

    def __call__(self, start: int, end: int, logits: torch.Tensor) -> None:
        a, b = max(start, self.first), min(end, self.n - 1)
        if b <= a:
            return
        piece = logits[:, a - start : b - start]
        if self.ref is not None:
            kl, agree = kl_and_agreement(self.ref.logp[:, a - self.ref.lo : b - self.ref.lo], piece)
            self.kl = self.kl + kl.sum()
            self.agree += float(agree.sum())
        self.count += b - a
        if self.with_ce:
            target = self.targets[a:b].to(piece.device)
            self.ce = self.ce - torch.log_softmax(piece, -1)[0].gather(-1, target[:, None]).sum()


def _zero(module: torch.nn.Module) -> torch.Tensor:
    return sum(p.sum() * 0.0 for p in module.parameters())


def distillation_loss(student, peft_model, lm, sequences: list[list[int]], budget: int, interval: int,
                      sinks: int = 0, ce_weight: float = 0.0,
                      anchor_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Pooled KL(p_full || p_evicted) (+ ``ce_weight`` * CE) over positions ``>= B + W`` of ``sequences``, plus
    ``anchor_weight`` * KL(p_full || p_adapted,full): the adapted model with the *full* cache held to the base
    model at the same positions, so that adapting to eviction does not change the uncompressed model (the method
    4b asks for its CE within 1% of the base) and a stronger adapter stays within that allowance.

    ``student`` is called as ``student(sequence, hook)`` (the :class:`EvictedStudent`, or the DeepSpeed engine
    around it). Returns the scalar loss (with graph) and detached metrics: ``kl`` (nats per position),
    ``ce_evicted`` / ``ce_full`` (mean CE of the student and the teacher at the same positions), their
    ``loss_ratio``, ``top1_agreement`` and ``positions``; with an anchor also ``anchor_kl`` (nats per position)
    and ``ce_adapted_full`` (the adapted model's full-cache CE at those positions).
    """
    first = budget + interval
    kl = ce = anchor = 0.0
    count, agree, ce_ev, ce_full, ce_af = 0, 0.0, 0.0, 0.0, 0.0
    for seq in sequences:
        if len(seq) - 1 <= first:
            continue
        ref, teacher_ce = teacher_log_probs(peft_model, lm, seq, first, interval, sinks)
        hook = StudentKL(ref, first, seq, with_ce=ce_weight > 0)
        res = student(seq, hook)
        kl, ce, count, agree = kl + hook.kl, ce + hook.ce, count + hook.count, agree + hook.agree
        ce_ev += float(res.ce[0, first:].double().nansum())
        ce_full += float(teacher_ce[first:].double().nansum())
        if anchor_weight > 0:
            held = StudentKL(ref, first, seq)
            res_full = student(seq, held, full=True)
            anchor = anchor + held.kl
            ce_af += float(res_full.ce[0, first:].double().nansum())
    module = getattr(student, "module", student)
    if count == 0:  # no sequence reaches the first eviction: a zero loss that keeps the graph
        return _zero(module), {"positions": 0}
    loss = kl / count + (ce_weight * ce / count if ce_weight > 0 else 0.0)
    metrics = {"kl": float(kl.detach()) / count, "ce_evicted": ce_ev / count, "ce_full": ce_full / count,
               "loss_ratio": ce_ev / ce_full if ce_full > 0 else float("nan"), "top1_agreement": agree / count,
               "positions": count}
    if anchor_weight > 0:
        loss = loss + anchor_weight * anchor / count
        metrics.update(anchor_kl=float(anchor.detach()) / count, ce_adapted_full=ce_af / count)
    return loss, metrics


__all__ = ["EvictedStudent", "StudentKL", "distillation_loss", "full_reference", "teacher_log_probs"]
