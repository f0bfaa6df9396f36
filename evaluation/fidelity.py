"""Fidelity of an evicted cache to the full cache on fixed traces (docs/evaluation.md).

Every trace is replayed once with the full cache (the reference) and once per (policy, budget) with the budgeted
cache, all through :func:`foresight.replay`, so the evicted runs see exactly the cache that decoding would have.
Metrics are pooled over every token position ``i >= B + W`` (the first prediction made after the first eviction)
of every trace:

* ``loss_ratio`` = mean CE_evicted / mean CE_full (1.0 = no harm);
* ``delta_ce`` = mean (CE_evicted - CE_full), in nats per token;
* ``kl`` = mean KL(p_full || p_evicted) of the next-token distributions, nats per token;
* ``top1_agreement`` = fraction of positions where both caches predict the same argmax token.

KL and top-1 need the whole reference distribution. We keep the full cache's log-probs of one batch of traces
in memory (positions ``>= min(B) + W`` only, ``ref_dtype``, fp32 by default: about 200 KB per position for a
49K vocabulary) while every policy and budget is replayed against them, then drop them; traces are processed
``batch_size`` at a time. This is the "store per trace" variant: simpler than lockstep decoding and exact.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm.auto import tqdm

from evaluation.fidelity_journal import FidelityJournal, policy_digest, tokens_digest
from foresight.errors import ForesightError
from foresight.fingerprint import weights_dtype
from foresight.models import model_fingerprint
from foresight.policies import EvictionPolicy, make_policy
from foresight.policies.base import require_cache
from foresight.runtime import CacheConfig, length_batches, replay

#: ``factory(name, budget)`` builds the policy for one budget, or returns ``None`` to skip that combination
#: (e.g. no golden labels for this budget).
PolicyFactory = Callable[[str, int], "EvictionPolicy | None"]

FIELDS = ("policy", "budget", "interval", "loss_ratio", "delta_ce", "kl", "top1_agreement", "tokens")


@dataclass
class _Accumulator:
    """Running sums of the per-token metrics of one (policy, budget)."""

    ce: float = 0.0
    ce_full: float = 0.0
    kl: float = 0.0
    agree: float = 0.0
    tokens: int = 0
    kl_tokens: int = 0
    per_trace_delta: list[tuple[float, int]] = field(default_factory=list)  # (summed ΔCE, scored positions)
    per_trace_ratio: dict[str, float] = field(default_factory=dict)
    per_trace_ce: dict[str, list] = field(default_factory=dict)  # trace -> [summed CE, summed full-cache CE, positions]

    def record(self, policy: str, budget: int, interval: int, extra: dict, order: Sequence[str]) -> dict:
        """The (policy, budget) record; its per-trace fields list the traces in ``order``."""
        n = self.tokens
        nan = float("nan")
        ratios = {t: self.per_trace_ratio[t] for t in order if t in self.per_trace_ratio}
        deltas = self.per_trace_delta
        se = pooled_delta_se(deltas)
        return {
            "policy": policy,
            "budget": budget,
            "interval": interval,
            "loss_ratio": self.ce / self.ce_full if n and self.ce_full > 0 else nan,
            "delta_ce": (self.ce - self.ce_full) / n if n else nan,
            "kl": self.kl / self.kl_tokens if self.kl_tokens else nan,
            "top1_agreement": self.agree / self.kl_tokens if self.kl_tokens else nan,
            "tokens": n,
            "ce": self.ce / n if n else nan,
            "ce_full": self.ce_full / n if n else nan,
            "delta_ce_se": se,
            "traces": len(deltas),
            "mean_trace_ratio": sum(ratios.values()) / len(ratios) if ratios else nan,
            "per_trace_ratio": ratios,
            "per_trace_ce": {t: self.per_trace_ce[t] for t in order if t in self.per_trace_ce},
            **extra,
        }


def pooled_delta_se(rows: Sequence[tuple[float, int]]) -> float:
    """Standard error of the pooled ΔCE ``sum(d) / sum(n)`` over traces ``(d, n)`` (summed ΔCE, scored positions):
    the ratio estimator's linearised (cluster) SE, ``sqrt(k/(k-1) * sum((d - r*n)^2)) / sum(n)``, so a long trace
    weighs in the error as it does in the number; NaN for fewer than two traces."""
    k, total = len(rows), sum(n for _, n in rows)
    if k < 2 or total <= 0:
        return float("nan")
    r = sum(d for d, _ in rows) / total
    return math.sqrt(k / (k - 1) * sum((d - r * n) ** 2 for d, n in rows)) / total


def default_factory(policy_kwargs: dict[str, dict] | None = None) -> PolicyFactory:
    """Factory building registered policies by name with optional per-name hyperparameters."""
    kwargs = policy_kwargs or {}

    def factory(name: str, budget: int) -> EvictionPolicy:
        return make_policy(name, **kwargs.get(name, {}))

    return factory


def _policy_label(policy: str | EvictionPolicy) -> str:
    return policy if isinstance(policy, str) else policy.name


def kl_and_agreement(ref_logp: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position KL(p_full || p_evicted) and top-1 agreement from the full cache's log-probs ``ref_logp`` and
    the evicted cache's ``logits`` (both (..., V)); differentiable in ``logits`` (``foresight train adapt``
    minimises exactly this KL)."""
    lp = torch.log_softmax(logits, dim=-1)
    ref = ref_logp.float()
    return (ref.exp() * (ref - lp)).sum(-1), (ref.argmax(-1) == lp.argmax(-1)).float()


class ReferenceLogProbs:
    """``on_logits`` hook storing the full cache's log-probs for positions ``>= lo`` (``logp``: (batch, n-1-lo, V))."""

    def __init__(self, lo: int, n: int, dtype: torch.dtype):
        self.lo, self.n, self.dtype = lo, n, dtype
        self.logp: torch.Tensor | None = None

    def __call__(self, start: int, end: int, logits: torch.Tensor) -> None:
        a, b = max(start, self.lo), min(end, self.n - 1)
        if b <= a:
            return
        lp = torch.log_softmax(logits[:, a - start : b - start], dim=-1).to(self.dtype)
        if self.logp is None:
            batch, _, vocab = logits.shape
            self.logp = torch.empty(batch, self.n - 1 - self.lo, vocab, dtype=self.dtype, device=logits.device)
        self.logp[:, a - self.lo : b - self.lo] = lp


class _CompareHook:
    """``on_logits`` hook accumulating KL(full || evicted) and top-1 agreement at positions ``>= first``."""

    def __init__(self, ref: ReferenceLogProbs, first: int, valid: torch.Tensor):
        self.ref, self.first, self.valid = ref, first, valid  # valid: (batch, n-1) bool on the logits device
        self.kl = torch.zeros(valid.shape[0], dtype=torch.float64)
        self.agree = torch.zeros_like(self.kl)
        self.count = torch.zeros_like(self.kl)

    def __call__(self, start: int, end: int, logits: torch.Tensor) -> None:
        a, b = max(start, self.first), min(end, self.ref.n - 1)
        if b <= a:
            return
        ref = self.ref.logp[:, a - self.ref.lo : b - self.ref.lo]
        kl, agree = kl_and_agreement(ref, logits[:, a - start : b - start])
        mask = self.valid[:, a:b].float()
        self.kl += (kl * mask).sum(-1).double().cpu()
        self.agree += (agree * mask).sum(-1).double().cpu()
        self.count += mask.sum(-1).double().cpu()


def evaluate_fidelity(
    model,
    sequences: Sequence[Sequence[int]],
    policies: Sequence[str | EvictionPolicy],
    budgets: Sequence[int],
    interval: int,
    *,
    trace_ids: Sequence[str] | None = None,
    policy_factory: PolicyFactory | None = None,
    policy_kwargs: dict[str, dict] | None = None,
    sinks: int = 0,
    batch_size: int = 1,
    ref_dtype: torch.dtype = torch.float32,
    progress: bool = False,
    on_skip: Callable[[str, int, str], None] | None = None,
    journal: str | Path | None = None,
    score_from: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> list[dict] | None:
    """Replay ``sequences`` under every policy and budget and compare with the full cache.

    Parameters
    ----------
    sequences
        Token-id lists (prompt + generated).
    policies
        Registered names (built per budget by ``policy_factory``) or ready :class:`EvictionPolicy` instances
        (used for every budget).
    budgets, interval
        The budgets ``B`` to evaluate and the interval ``W``; each ``B`` must exceed ``W``.
    trace_ids
        Passed to every replay as ``trace_ids`` metadata (the golden policy looks its labels up by them).
    policy_factory
        ``factory(name, budget) -> policy | None``; ``None`` skips that combination (reported to ``on_skip``).
    sinks
        Never evict the first ``sinks`` positions.
    batch_size
        Traces replayed together (and whose reference log-probs are held in memory together), batched longest
        first (:func:`~foresight.runtime.length_batches`: batches of similar lengths pad least).
    ref_dtype
        Storage dtype of the reference log-probs (fp32 default; bf16/fp16 halve the memory).
    journal
        A JSON-lines file (:mod:`evaluation.fidelity_journal`) that every finished batch is appended to: rerun
        after a crash with the same file and the same inputs, the evaluation resumes where it stopped and returns
        what an uninterrupted run returns; a journal of other inputs is refused. The caller deletes it once the
        results are written (:func:`~evaluation.fidelity_journal.remove_journal`).
    rank, world_size
        Shard the batches over processes (``journal`` required): this rank replays the batches ``k`` with
        ``k % world_size == rank`` that no rank's journal file holds yet, and returns ``None`` while a batch of
        another rank is missing. Once every rank is done, a run in one process (or any rank) replays nothing and
        returns what an unsharded run returns, exactly (the same sums, added in batch order).
    score_from
        Score positions ``>= max(B + W, score_from)`` only. Budgets compared with each other need the same scored
        positions: ``score_from`` = the largest ``B + W`` puts every budget on the positions the largest scores.

    Returns
    -------
    list of dict, or None
        ``None`` only for a rank whose shard is done while another's is not. Otherwise one record per (policy,
        budget) with the fields of :data:`FIELDS` plus ``ce``, ``ce_full``,
        ``delta_ce_se`` (standard error of the pooled ΔCE over traces, :func:`pooled_delta_se`), ``traces``, ``per_trace_ratio``
        (``{trace_id: loss ratio of that trace}``), ``mean_trace_ratio`` (their mean), ``mean_trace_len``,
        ``budget_frac`` (budget / mean trace length) and the policy's hyperparameters ``policy_config``.
    """
    if not sequences:
        raise ForesightError("no traces to evaluate")
    if not budgets:
        raise ForesightError("no budgets given")
    if score_from < 0:
        raise ForesightError(f"score_from {score_from}: must be >= 0")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ForesightError(f"rank {rank} of world size {world_size}: need 0 <= rank < world size")
    if world_size > 1 and journal is None:
        raise ForesightError("a sharded evaluation (world size > 1) needs a journal: the ranks meet in its files")
    for b in budgets:
        try:
            CacheConfig(int(b), interval, sinks)
        except ValueError as exc:
            raise ForesightError(f"budget {b}: {exc}") from None
    if trace_ids is not None and len(trace_ids) != len(sequences):
        raise ValueError("trace_ids must have one id per sequence")
    if trace_ids is not None and len(set(map(str, trace_ids))) != len(trace_ids):  # per-trace ratios are keyed by id
        dup = Counter(map(str, trace_ids)).most_common(1)[0]
        raise ForesightError(f"trace id {dup[0]!r} appears {dup[1]} times; every trace needs its own id")
    factory = policy_factory or default_factory(policy_kwargs)
    budgets = sorted({int(b) for b in budgets})
    lengths = [len(s) for s in sequences]
    mean_len = sum(lengths) / len(lengths)

    # Build every policy up front so bad names fail before any compute.
    plan: list[tuple[str, int, EvictionPolicy]] = []
    for p in policies:
        for b in budgets:
            name, pol = (p.name, p) if isinstance(p, EvictionPolicy) else (p, factory(p, b))
            if pol is None:
                if on_skip:
                    on_skip(p, b, f"no {p!r} policy for B={b}, W={interval} (e.g. no golden labels for them)")
                continue
            require_cache(pol, b, interval)  # e.g. a scorer trained for another (B, W): before any compute
            if sinks and getattr(pol, "replay_only", False):  # fixed evictions (golden's labels), made without sinks
                raise ForesightError(f"policy {name!r} replays labels made without attention sinks; evaluate it "
                                     f"with sinks 0, not {sinks} (its replay would diverge at the first event)")
            plan.append((name, b, pol))
    # Labels meet traces here: a golden policy checks its labels against these exact token ids (hashes) and this
    # model now, before any compute (it checks again at every replay).
    all_ids = list(trace_ids) if trace_ids is not None else [str(i) for i in range(len(sequences))]
    fp = model_fingerprint(model)
    for _, _, pol in plan:
        check = getattr(pol, "check_traces", None)
        if callable(check):
            check(all_ids, [list(map(int, s)) for s in sequences], fp)
    given = all_ids  # the records list traces in this order
    # batches of similar lengths pad least (one trace a batch: the given order); every result is keyed by trace id.
    # The sequences are put in batch order, batch k being sequences[s0:s1] of spans[k].
    batches = length_batches(lengths, batch_size) if batch_size > 1 else [[i] for i in range(len(sequences))]
    order = [i for batch in batches for i in batch]
    sequences, all_ids = [sequences[i] for i in order], [all_ids[i] for i in order]
    ends = list(accumulate(len(batch) for batch in batches))
    spans = list(zip([0, *ends[:-1]], ends))
    acc = {(name, b): _Accumulator() for name, b, _ in plan}
    lo = max(budgets[0] + interval, score_from)
    jr = None
    if journal is not None:
        jr = FidelityJournal(journal, {
            "model": fp, "tokens": tokens_digest(all_ids, sequences), "interval": interval, "sinks": sinks,
            "batch_size": batch_size, **({"batches": "longest first"} if batch_size > 1 else {}),
            "ref_dtype": str(ref_dtype), "score_from": score_from,
            **weights_dtype(model),  # the fingerprint names the model, not its precision
            "plan": [[name, b, _jsonable(pol.config()), policy_digest(pol)] for name, b, pol in plan]},
            rank, world_size)
    device = model.device
    pad = 0

    shown = sum(s1 - s0 for k, (s0, s1) in enumerate(spans)
                if k % world_size == rank or (jr is not None and s0 in jr.done))  # this rank's and those done
    outer = tqdm(total=shown, desc="fidelity" if world_size == 1 else f"fidelity[rank {rank}/{world_size}]",
                 disable=not progress)
    others = []  # batches of other ranks, not journalled yet
    for k, (s0, s1) in enumerate(spans):
        if jr is not None and s0 in jr.done:  # finished before a crash: the same sums, in the same order
            _check_batch(jr.done[s0], all_ids[s0:s1], plan, journal)
            _add_batch(acc, jr.done[s0])
            outer.update(s1 - s0)
            continue
        seqs = [list(map(int, s)) for s in sequences[s0:s1]]
        ids_meta = all_ids[s0:s1]
        n = max(len(s) for s in seqs)
        if n - 1 <= lo:
            outer.update(len(seqs))  # too short to reach the first event: no position to score
            continue
        if k % world_size != rank:
            others.append(s0)
            continue
        pos = torch.arange(n - 1, device=device)
        row_len = torch.tensor([len(s) for s in seqs], device=device)
        in_row = pos[None] < (row_len[:, None] - 1)  # (batch, n-1): position predicts a real next token
        ref = ReferenceLogProbs(lo, n, ref_dtype)
        full = replay(model, seqs, "full", None, interval, sinks=sinks, on_logits=ref,
                      pad_token_id=pad, trace_ids=ids_meta)
        ce_full = full.ce
        batch = {"start": s0, "policies": {}}
        for name, b, pol in plan:
            first = max(b + interval, score_from)
            valid = in_row & (pos[None] >= first)
            hook = _CompareHook(ref, first, valid)
            res = replay(model, seqs, pol, b, interval, sinks=sinks, on_logits=hook, pad_token_id=pad,
                         trace_ids=ids_meta)
            vmask = valid.cpu()
            rows = []
            for r in range(len(seqs)):
                m = vmask[r]
                cnt = int(m.sum())
                if cnt:
                    rows.append([ids_meta[r], res.ce[r][m].double().sum().item(),
                                 ce_full[r][m].double().sum().item(), cnt])
            batch["policies"][f"{name}@{b}"] = {"rows": rows, "kl": float(hook.kl.sum()),
                                                "agree": float(hook.agree.sum()), "kl_tokens": int(hook.count.sum())}
        del ref
        _add_batch(acc, batch)
        if jr is not None:
            jr.add(batch)
        outer.update(len(seqs))
    outer.close()
    if others:  # another rank's batches, finished meanwhile, are read now; still missing: not this rank's to sum
        jr = FidelityJournal(journal, jr.identity, rank, world_size)
        if any(s0 not in jr.done for s0 in others):
            return None
        acc = {key: _Accumulator() for key in acc}  # every batch journalled: summed again in batch order
        for s0, s1 in spans:
            if s0 in jr.done:  # too short to score: in no journal, as in no sum
                _check_batch(jr.done[s0], all_ids[s0:s1], plan, journal)
                _add_batch(acc, jr.done[s0])

    records = []
    for name, b, pol in plan:
        extra = {
            "mean_trace_len": mean_len,
            "budget_frac": b / mean_len,
            "sinks": sinks,
            "score_from": max(b + interval, score_from),
            "policy_config": _jsonable(pol.config()),
        }
        records.append(acc[(name, b)].record(name, b, interval, extra, given))
    return records


def _check_batch(batch: dict, ids: Sequence[str], plan: list, journal) -> None:
    """Refuse a journal record that is not this batch's: sums of other traces (a line moved or edited by hand), of
    another plan, or values that are not numbers. A record is reused only as exactly what the run would compute."""
    def bad(why: str):
        return ForesightError(f"{journal}: the record of the batch starting at trace {batch['start']} {why}; delete "
                              "the journal to start over")

    keys = {f"{name}@{b}" for name, b, _ in plan}
    if set(batch["policies"]) != keys:
        raise bad(f"holds {sorted(batch['policies'])}, not this evaluation's {sorted(keys)}")
    for key, part in batch["policies"].items():
        rows = part.get("rows") if isinstance(part, dict) else None
        if not isinstance(rows, list) or not all(isinstance(part.get(k), (int, float)) for k in
                                                 ("kl", "agree", "kl_tokens")):
            raise bad(f"has no rows and sums for {key}")
        for row in rows:
            if (not isinstance(row, list) or len(row) != 4 or row[0] not in ids
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row[1:])):
                raise bad(f"holds a row of {key} that is not one of its traces ({ids[0]}..{ids[-1]}): {row!r:.80}")
        if len({row[0] for row in rows}) != len(rows):
            raise bad(f"holds a trace twice under {key}")


def _add_batch(acc: dict[tuple[str, int], _Accumulator], batch: dict) -> None:
    """Add one batch's sums (per trace: CE evicted, CE full, scored positions; KL and top-1 pooled) to ``acc``."""
    for (name, b), a in acc.items():
        part = batch["policies"][f"{name}@{b}"]
        for tid, ce_r, cf_r, cnt in part["rows"]:
            a.ce += ce_r
            a.ce_full += cf_r
            a.tokens += cnt
            a.per_trace_delta.append((ce_r - cf_r, cnt))
            a.per_trace_ratio[tid] = ce_r / cf_r if cf_r > 0 else float("nan")
            a.per_trace_ce[tid] = [ce_r, cf_r, cnt]
        a.kl += part["kl"]
        a.agree += part["agree"]
        a.kl_tokens += part["kl_tokens"]


def _jsonable(cfg: dict) -> dict:
    out = {}
    for k, v in cfg.items():
        out[k] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)[:200]
    return out


__all__ = ["FIELDS", "PolicyFactory", "ReferenceLogProbs", "default_factory", "evaluate_fidelity", "kl_and_agreement", "pooled_delta_se"]
