"""The one decoding engine: budgeted generation and chunked teacher-forced replay (DESIGN.md section 1).

Both drive a :class:`~foresight.cache.BudgetedCache`, which owns the eviction rule (when and what to evict, see
:mod:`foresight.schedule`); this module only feeds tokens:

* :func:`generate` prefills the prompt in one call (the cache cuts it at the event points) and decodes token by
  token, greedy or sampled, batch and left padding included;
* :func:`replay` feeds a fixed sequence in the pieces of :func:`~foresight.schedule.replay_schedule` (at most
  ``W`` tokens, never straddling an event) and records per-token cross-entropy and entropy. With ``chunk=1`` it is
  token-by-token decoding; generation and replay of the same tokens evict at the same points.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from foresight.cache import BudgetedCache
from foresight.models import SUPPORTED_MODEL_TYPES, UnsupportedModelError, check_supported, model_shape
from foresight.policies import EvictionPolicy, make_policy
from foresight.schedule import CacheConfig, replay_schedule


def resolve_policy(policy: str | EvictionPolicy, **policy_kwargs) -> EvictionPolicy:
    return make_policy(policy, **policy_kwargs) if isinstance(policy, str) else policy


def _forward(model, cache: BudgetedCache, input_ids, positions, attention_mask=None, logits_to_keep: int = 0):
    out = model(
        input_ids=input_ids,
        position_ids=positions,
        attention_mask=attention_mask,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits


# ----------------------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class GenerationResult:
    """Output of :func:`generate`.

    ``sequences`` is (batch, prompt_len + new) like ``model.generate`` (prompt left-padded, finished rows padded
    with ``pad_token_id``); ``token_ids`` the generated ids per row up to and including EOS; ``texts`` their
    decoding; ``stats`` the cache statistics.
    """

    texts: list[str]
    token_ids: list[list[int]]
    sequences: torch.Tensor
    prompt_lengths: list[int]
    stats: dict = field(default_factory=dict)


def _sampling_processors(temperature: float, top_k: int, top_p: float):
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k and top_k > 0:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return procs


def _encode_prompts(tokenizer, prompts, device):
    if isinstance(prompts, str):
        prompts = [prompts]
    if prompts and isinstance(prompts[0], str):
        tokenizer.padding_side = "left"
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
        return enc["input_ids"].to(device), enc["attention_mask"].to(device)
    seqs = [list(p) for p in prompts]
    width = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
    return ids, mask


@torch.inference_mode()
def generate(
    model,
    tokenizer,
    prompts: str | Sequence[str] | Sequence[Sequence[int]],
    policy: str | EvictionPolicy = "full",
    budget: int | None = None,
    interval: int | None = None,
    max_new_tokens: int = 256,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | Sequence[int] | None = None,
    sinks: int = 0,
    protect_prompt: bool = False,
    stop_on_eos: bool = True,
    progress: bool = False,
    policy_kwargs: dict | None = None,
    align: str = "rows",
) -> GenerationResult:
    """Generate continuations of ``prompts`` with a KV cache bounded by ``budget`` under ``policy``.

    Parameters
    ----------
    prompts
        A string, a list of strings (tokenised with left padding) or a list of token-id lists.
    policy
        A registered name (``foresight policies``) or an :class:`EvictionPolicy` instance.
    budget, interval
        B and W (DESIGN.md section 1). ``budget=None`` keeps the full cache.
    do_sample, temperature, top_p, top_k, seed
        Greedy by default; sampling uses transformers' logits warpers and a seeded generator. ``seed`` may be
        a list with one seed per row: each row then samples from its own generator, so a row's tokens do not
        depend on which other rows share its batch (used for reproducible trace sampling).
    sinks
        Never evict the first ``sinks`` positions.
    protect_prompt
        Leave the prompt uncompressed: prompt entries are never evicted and the budget applies to the
        generated tokens on top of the (longest) prompt.
    align
        How prompts of different lengths share a budgeted cache. ``"rows"`` (default): rows are decoded in groups
        of equal prompt length, so no row is padded and every row evicts exactly where its own replay does (and
        its tokens do not depend on which other prompts share the call). ``"batch"``: one left-padded batch with
        one schedule counted in padded positions, as ``model.generate`` with a :class:`BudgetedCache` runs it (a
        padded row's events then come earlier than if it ran alone).
    """
    if align not in ("rows", "batch"):
        raise ValueError(f"align must be 'rows' or 'batch', got {align!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    policy = resolve_policy(policy, **(policy_kwargs or {}))
    device = model.device
    input_ids, attn = _encode_prompts(tokenizer, prompts, device)
    batch, plen = input_ids.shape
    prompt_lengths = attn.sum(-1).tolist()
    if align == "rows" and budget is not None and policy.evicts and len(set(prompt_lengths)) > 1:
        rows = [ids[ids.shape[0] - n :].tolist() for ids, n in zip(input_ids, prompt_lengths)]
        settings = dict(policy=policy, budget=budget, interval=interval, max_new_tokens=max_new_tokens,
                        do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k, sinks=sinks,
                        protect_prompt=protect_prompt, stop_on_eos=stop_on_eos, progress=progress, align="batch")
        return _generate_by_length(model, tokenizer, rows, seed, settings)
    cache = BudgetedCache(model, policy, budget, interval, sinks, protect_prompt)
    eos = eos_token_ids(model, tokenizer) if stop_on_eos else set()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gen = torch.Generator(device=device)
    row_gens = None
    if isinstance(seed, int):
        gen.manual_seed(seed)
    elif seed is not None:
        if len(seed) != batch:
            raise ValueError(f"got {len(seed)} per-row seeds for {batch} prompts")
        row_gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seed]
    procs = _sampling_processors(temperature, top_k, top_p) if do_sample else None

    positions = (attn.long().cumsum(-1) - 1).clamp_(min=0)
    logits = _forward(model, cache, input_ids, positions, attn, logits_to_keep=1)
    next_pos = positions[:, -1] + 1
    out = input_ids
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos_t = torch.tensor(sorted(eos), device=device) if eos else None
    ones = torch.ones(batch, 1, dtype=attn.dtype, device=device)
    bar = tqdm(total=max_new_tokens, desc=f"generate[{policy.name}]", disable=not progress, leave=False)
    for step in range(max_new_tokens):
        scores = logits[:, -1, :].float()
        if do_sample:
            scores = procs(out, scores)
            probs = torch.softmax(scores, dim=-1)
            if row_gens is None:
                token = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            else:
                rows = [torch.multinomial(probs[i : i + 1], 1, generator=g) for i, g in enumerate(row_gens)]
                token = torch.cat(rows).squeeze(1)
        else:
            token = scores.argmax(dim=-1)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        out = torch.cat([out, token[:, None]], dim=-1)
        if eos_t is not None:
            finished |= torch.isin(token, eos_t)
        bar.update(1)
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        attn = torch.cat([attn, ones], dim=-1)
        logits = _forward(model, cache, token[:, None], next_pos[:, None], attn)
        next_pos = next_pos + 1
    bar.close()

    token_ids = []
    for row in out[:, plen:].tolist():
        ids = []
        for t in row:
            ids.append(t)
            if t in eos:
                break
        token_ids.append(ids)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids]
    stats = {**cache.stats(), "policy": policy.name}
    return GenerationResult(texts, token_ids, out, prompt_lengths, stats)


def _generate_by_length(model, tokenizer, rows: list[list[int]], seed, settings: dict) -> GenerationResult:
    """:func:`generate` per group of equal-length prompts (no padding), reassembled in the callers' order."""
    if seed is not None and not isinstance(seed, int) and len(seed) != len(rows):
        raise ValueError(f"got {len(seed)} per-row seeds for {len(rows)} prompts")
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(len(r), []).append(i)
    parts = {}
    for idx in groups.values():
        row_seed = seed if seed is None or isinstance(seed, int) else [seed[i] for i in idx]
        parts[tuple(idx)] = generate(model, tokenizer, [rows[i] for i in idx], seed=row_seed, **settings)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width_p = max(len(r) for r in rows)
    width_new = max(res.sequences.shape[1] - res.prompt_lengths[0] for res in parts.values())
    sequences = torch.full((len(rows), width_p + width_new), pad, dtype=torch.long)
    token_ids: list = [None] * len(rows)
    texts: list = [None] * len(rows)
    for idx, res in parts.items():
        p = res.prompt_lengths[0]
        for j, i in enumerate(idx):
            seq = res.sequences[j].cpu()
            sequences[i, width_p - p : width_p + seq.shape[0] - p] = seq
            token_ids[i], texts[i] = res.token_ids[j], res.texts[j]
    stats = [res.stats for res in parts.values()]
    merged = {**stats[0],
              "peak_entries": [max(col) for col in zip(*(s["peak_entries"] for s in stats))],
              "final_entries": max(s["final_entries"] for s in stats),
              "evictions": max(s["evictions"] for s in stats),
              "evicted_entries": sum(s["evicted_entries"] for s in stats),
              "groups": len(stats)}
    return GenerationResult(texts, token_ids, sequences.to(parts[next(iter(parts))].sequences.device),
                            [len(r) for r in rows], merged)


def eos_token_ids(model, tokenizer) -> set[int]:
    """Token ids that end a sequence: the generation config's EOS id(s), else the tokenizer's."""
    ids = model.generation_config.eos_token_id
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return set()
    return {int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])}


# ----------------------------------------------------------------------------------------------------------------
# Chunked teacher-forced replay
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """Per-token cross-entropy and next-token entropy from :func:`replay`.

    ``ce[b, i]`` is ``-log p(x[i+1] | x[:i+1])`` under the evicted cache (NaN past a row's length);
    ``entropy[b, i]`` the entropy of that next-token distribution. Both (batch, N-1), fp32, on CPU.
    """

    ce: torch.Tensor
    entropy: torch.Tensor
    lengths: list[int]
    stats: dict = field(default_factory=dict)


LogitsHook = Callable[[int, int, torch.Tensor], None]


def _autograd(grad: bool):
    """Inference mode, or (``grad``) autograd on even under a caller's ``no_grad`` / ``inference_mode``."""
    if not grad:
        return torch.inference_mode()
    stack = ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad())
    return stack


def replay(
    model,
    sequences: torch.Tensor | Sequence[Sequence[int]],
    policy: str | EvictionPolicy = "full",
    budget: int | None = None,
    interval: int | None = None,
    sinks: int = 0,
    chunk: int | None = None,
    on_logits: LogitsHook | None = None,
    progress: bool = False,
    policy_kwargs: dict | None = None,
    pad_token_id: int = 0,
    grad: bool = False,
    truncate_backprop: bool = False,
    **meta,
) -> ReplayResult:
    """Teacher-forced replay of fixed token sequences under an eviction policy.

    Feeds the sequences in pieces of at most ``chunk`` (default ``W``) tokens; each piece attends to the evicted
    cache plus itself causally, and the cache is evicted after every piece that reaches an event (see
    :func:`replay_schedule`). With ``chunk=1`` this is token-by-token decoding, and the results agree.

    Parameters
    ----------
    sequences
        (batch, N) token ids or a list of id lists (right-padded internally; padding only follows real tokens,
        so it never influences them).
    on_logits
        Optional hook ``f(start, end, logits)`` called with each piece's fp32 (fp64 for an fp64 model) logits
        (batch, end-start, V), for metrics that need whole distributions (KL, top-1 agreement).
    grad
        Record gradients (default: inference mode): ``on_logits`` then receives logits with their graph, through
        the same schedule, cache and policy (eviction decisions stay without gradient; the cache keeps its entries
        out of place, see :class:`~foresight.cache.BudgetedLayer`). Used to train a model under its own eviction
        (``foresight train adapt``). ``ce``/``entropy`` are detached.
    truncate_backprop
        With ``grad``: detach the cached keys/values after every piece, so gradients flow within a piece only.
    meta
        Passed to ``policy.reset`` (e.g. ``trace_ids`` for the golden policy).
    """
    policy = resolve_policy(policy, **(policy_kwargs or {}))
    device = model.device
    if isinstance(sequences, torch.Tensor):
        ids = sequences.to(device)
        if ids.dim() == 1:
            ids = ids[None]
        lengths = [ids.shape[1]] * ids.shape[0]
    else:
        lengths = [len(s) for s in sequences]
        width = max(lengths)
        ids = torch.tensor([list(s) + [pad_token_id] * (width - len(s)) for s in sequences], device=device)
    batch, n = ids.shape
    # the rows' real tokens reach the policy too: the golden policy checks them against its labels' token hashes
    cache = BudgetedCache(model, policy, budget, interval, sinks,
                          token_ids=[ids[b, : lengths[b]] for b in range(batch)], **meta)
    ce = torch.full((batch, max(n - 1, 0)), float("nan"))
    ent = torch.full_like(ce, float("nan"))
    pieces = cache.pieces(n, chunk)
    positions_all = torch.arange(n, device=device)[None].expand(batch, -1)
    with _autograd(grad):
        for start, end, _ in tqdm(pieces, desc=f"replay[{policy.name}]", disable=not progress, leave=False):
            logits = _forward(model, cache, ids[:, start:end], positions_all[:, start:end])
            logits = logits if logits.dtype == torch.float64 else logits.float()  # fp32, fp64 models keep fp64
            if on_logits is not None:
                on_logits(start, end, logits)
            if truncate_backprop:
                cache.detach_()
            _record_ce(ce, ent, ids, logits.detach(), start, min(end, n - 1))
    for b, length in enumerate(lengths):
        ce[b, max(length - 1, 0) :] = float("nan")
        ent[b, max(length - 1, 0) :] = float("nan")
    stats = {**cache.stats(), "policy": policy.name}
    return ReplayResult(ce, ent, lengths, stats)


def _record_ce(ce: torch.Tensor, ent: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, start: int,
               stop: int) -> None:
    """Write the CE and entropy of positions ``start .. stop-1`` of one piece's logits into ``ce`` / ``ent``."""
    if stop <= start:
        return
    lp = torch.log_softmax(logits[:, : stop - start], dim=-1)
    target = ids[:, start + 1 : stop + 1]
    ce[:, start:stop] = -lp.gather(-1, target[..., None]).squeeze(-1).cpu()
    ent[:, start:stop] = -(lp.exp() * lp).sum(-1).cpu()


def full_forward_ce(model, ids: torch.Tensor) -> torch.Tensor:
    """Reference: per-token CE of one plain full-attention forward pass, (batch, N-1) on CPU."""
    with torch.inference_mode():
        logits = model(input_ids=ids.to(model.device)).logits.float()
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:].to(model.device), reduction="none").cpu()


__all__ = [  # CacheConfig, replay_schedule and the model checks are re-exported for callers of the engine
    "CacheConfig",
    "GenerationResult",
    "ReplayResult",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "check_supported",
    "eos_token_ids",
    "full_forward_ce",
    "generate",
    "model_shape",
    "replay",
    "replay_schedule",
    "resolve_policy",
]
