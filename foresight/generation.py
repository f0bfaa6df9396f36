"""Budgeted generation (docs/runtime.md): prefill the prompt in one call (the cache cuts it at the event
points) and decode token by token, greedy or sampled, batch and left padding included, through
:func:`foresight.runtime.forward_logits`, the forward replay uses too, so generation and replay of the same tokens
evict at the same points.

The decode steps read nothing back from the device (no ``.item()``, ``.tolist()``, ``.cpu()`` or branch on a
tensor's value), so the host queues step after step while the device computes: whether every row has finished is
read once every :data:`EOS_READ_EVERY` steps (:func:`_finished_rows`), the policy may read once per eviction event
(:meth:`~foresight.policies.base.EvictionPolicy.end_event`), and the tokens are read once at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from foresight.limits import check_generation
from foresight.policies import EvictionPolicy
from foresight.runtime import check_token_ids, forward_logits, resolve_policy
from foresight.static_cache import make_cache
from foresight.static_step import StaticConfig

#: Decode steps between two reads of whether every row has finished (with ``stop_on_eos``): the decode loop's one
#: read, so the device runs ahead in between. Rows that finished are fed padding until the next read, which drops
#: them from the batch where it can (:meth:`~foresight.cache.BudgetedCache.select_rows`); the steps decoded after
#: the last row finished are cut from the result, which is therefore the same as reading after every step.
EOS_READ_EVERY = 16


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
    static: bool | StaticConfig = False,
) -> GenerationResult:
    """Generate continuations of ``prompts`` with a KV cache bounded by ``budget`` under ``policy``.

    Parameters
    ----------
    prompts
        A string, a list of strings (tokenised with left padding) or a list of token-id lists.
    policy
        A registered name (``foresight policies``) or an :class:`EvictionPolicy` instance.
    budget, interval
        B and W (docs/runtime.md). ``budget=None`` keeps the full cache.
    do_sample, temperature, top_p, top_k, seed
        Greedy by default; sampling uses transformers' logits warpers and a seeded generator. ``seed`` may be
        a list with one seed per row: each row then samples from its own generator, so a row's tokens do not
        depend on which other rows share its batch (used for reproducible trace sampling).
    sinks
        Never evict the first ``sinks`` positions.
    stop_on_eos
        End a row at EOS (the call ends when every row has). Finished rows leave the batch at the next of the
        reads every :data:`EOS_READ_EVERY` steps when the policy's state can follow
        (:attr:`~foresight.policies.base.EvictionPolicy.selects_rows`) and no generator is shared by the rows
        (greedy, or one ``seed`` per row); the other rows' tokens are the same either way.
    protect_prompt
        Leave the prompt uncompressed: prompt entries are never evicted and the budget applies to the
        generated tokens on top of the (longest) prompt.
    align
        How prompts of different lengths share a budgeted cache. ``"rows"`` (default): rows are decoded in groups
        of equal prompt length, so no row is padded and every row evicts exactly where its own replay does (and
        its tokens do not depend on which other prompts share the call). ``"batch"``: one left-padded batch with
        one schedule counted in padded positions, as ``model.generate`` with a :class:`BudgetedCache` runs it (a
        padded row's events then come earlier than if it ran alone).
    static
        Decode on the static-shape cache with a compiled step (:mod:`foresight.static_cache`; a
        :class:`~foresight.static_step.StaticConfig` chooses backend and mode); the same tokens as the eager cache.
        A policy it cannot take decodes eagerly, with the reason printed.
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
    kept = budget if budget is not None and policy.evicts and not protect_prompt else None  # at least B + W entries
    check_generation(model, 1 if isinstance(prompts, str) else len(prompts), 1, max_new_tokens, kept)  # before encoding
    input_ids, attn = _encode_prompts(tokenizer, prompts, device)
    check_token_ids(model, input_ids)
    batch, plen = input_ids.shape
    check_generation(model, batch, plen, max_new_tokens, kept)
    prompt_lengths = attn.sum(-1).tolist()
    if align == "rows" and budget is not None and policy.evicts and len(set(prompt_lengths)) > 1:
        rows = [ids[ids.shape[0] - n :].tolist() for ids, n in zip(input_ids, prompt_lengths)]
        settings = dict(policy=policy, budget=budget, interval=interval, max_new_tokens=max_new_tokens,
                        do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k, sinks=sinks,
                        protect_prompt=protect_prompt, stop_on_eos=stop_on_eos, progress=progress, align="batch",
                        static=static)
        return _generate_by_length(model, tokenizer, rows, seed, settings)
    cache = make_cache(model, policy, budget, interval, sinks, protect_prompt, static, plen + max_new_tokens,
                       padded=len(set(prompt_lengths)) > 1)
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
    logits = forward_logits(model, cache, input_ids, positions, attn, logits_to_keep=1)
    next_pos = positions[:, -1] + 1
    out = input_ids
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos_t = torch.tensor(sorted(eos), device=device) if eos else None
    # finished rows leave the batch when the cache can drop them and a row's tokens do not depend on the others'
    # (greedy, or a generator per row)
    drops = eos_t is not None and cache.selects_rows and (not do_sample or row_gens is not None)
    active: list[int] | None = None  # the rows still decoded (None: all)
    active_t: torch.Tensor | None = None  # the same, on the device
    ones = torch.ones(batch, 1, dtype=attn.dtype, device=device)
    bar = tqdm(total=max_new_tokens, desc=f"generate[{policy.name}]", disable=not progress, leave=False)
    for step in range(max_new_tokens):
        scores = logits[:, -1, :].float()
        if do_sample:
            scores = procs(out if active is None else out[active_t], scores)
            probs = torch.softmax(scores, dim=-1)
            if row_gens is None:
                token = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            else:
                gens = row_gens if active is None else [row_gens[i] for i in active]
                token = torch.cat([torch.multinomial(probs[i : i + 1], 1, generator=g)
                                   for i, g in enumerate(gens)]).squeeze(1)
        else:
            token = scores.argmax(dim=-1)
        done = finished if active is None else finished[active_t]
        token = torch.where(done, torch.full_like(token, pad_id), token)
        every = token if active is None else torch.full((batch,), pad_id, dtype=token.dtype,
                                                        device=device).index_copy_(0, active_t, token)
        out = torch.cat([out, every[:, None]], dim=-1)
        if eos_t is not None:
            finished |= torch.isin(every, eos_t)
        bar.update(1)
        if step == max_new_tokens - 1:
            break
        if eos_t is not None and (step + 1) % EOS_READ_EVERY == 0:
            flags = _finished_rows(finished)
            if all(flags):
                break
            current = active or list(range(batch))
            keep = [j for j, i in enumerate(current) if not flags[i]]
            if drops and len(keep) < len(current):
                index = torch.tensor(keep, device=device)
                cache.select_rows(index)
                token, next_pos, attn, ones = token[index], next_pos[index], attn[index], ones[index]
                active = [current[j] for j in keep]
                active_t = torch.tensor(active, device=device)
        attn = torch.cat([attn, ones], dim=-1)
        logits = forward_logits(model, cache, token[:, None], next_pos[:, None], attn)
        next_pos = next_pos + 1
    bar.close()
    return _result(tokenizer, policy, cache, out, plen, eos, prompt_lengths)


def _finished_rows(finished: torch.Tensor) -> list[bool]:
    """Which rows have finished: the decode loop's one read from the device, every :data:`EOS_READ_EVERY` steps."""
    return finished.tolist()


def _result(tokenizer, policy, cache, out: torch.Tensor, plen: int, eos: set[int],
            prompt_lengths: list[int]) -> GenerationResult:
    """Read the generated tokens once, cut the steps decoded after the last row finished, and close the cache."""
    token_ids = []
    for row in out[:, plen:].tolist():
        ids = []
        for t in row:
            ids.append(t)
            if t in eos:
                break
        token_ids.append(ids)
    if token_ids and all(ids and ids[-1] in eos for ids in token_ids):  # every row stopped: as if read every step
        out = out[:, : plen + max(len(ids) for ids in token_ids)]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids]
    cache.flush_observations()  # the policy's state covers every step (decode steps wait for the next event)
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


__all__ = ["GenerationResult", "eos_token_ids", "generate"]
