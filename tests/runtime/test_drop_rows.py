"""Finished rows leave the batch (``BudgetedCache.select_rows``): the other rows' logits and tokens are unchanged."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import foresight
from foresight import generation
from foresight.cache import BudgetedCache
from foresight.policies.full import FullPolicy

PROMPTS = ["Hello world, this is a longer test prompt.", "Hi", "What is 2+2? Think.", "One more prompt here"]


def _common_token(model, tok, **kw) -> int:
    """A token most rows sample within a few steps (as EOS, rows finish at different times)."""
    kw = {"seed": [1, 2, 3, 4], **kw}
    free = foresight.generate(model, tok, PROMPTS, max_new_tokens=40, stop_on_eos=False, do_sample=True,
                              temperature=1.5, **kw)
    counts = Counter(t for ids in free.token_ids for t in set(ids))
    return counts.most_common(1)[0][0]


def _generate(model, tok, eos: int, **kw):
    model.generation_config.eos_token_id = eos
    try:
        return foresight.generate(model, tok, PROMPTS, max_new_tokens=60, do_sample=True, temperature=1.5, **kw)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id


@pytest.fixture
def calls(monkeypatch):
    """The row counts ``select_rows`` kept, call by call."""
    kept: list[int] = []
    select = BudgetedCache.select_rows

    def spy(self, rows):
        kept.append(len(rows))
        return select(self, rows)

    monkeypatch.setattr(BudgetedCache, "select_rows", spy)
    monkeypatch.setattr(generation, "EOS_READ_EVERY", 2)
    return kept


def test_dropping_finished_rows_changes_no_token(tiny_llama, calls, monkeypatch):
    model, tok = tiny_llama
    eos = _common_token(model, tok)
    dropped = _generate(model, tok, eos, seed=[1, 2, 3, 4])
    assert calls and calls == sorted(calls, reverse=True) and calls[-1] < len(PROMPTS)
    lengths = sorted(len(ids) for ids in dropped.token_ids)
    assert lengths[0] < lengths[-1] - 2  # rows did finish at different times
    monkeypatch.setattr(FullPolicy, "selects_rows", False)
    calls.clear()
    whole = _generate(model, tok, eos, seed=[1, 2, 3, 4])
    assert not calls
    assert dropped.token_ids == whole.token_ids
    assert torch.equal(dropped.sequences, whole.sequences)


def test_greedy_drops_rows_too(tiny_llama, calls, monkeypatch):
    model, tok = tiny_llama
    free = foresight.generate(model, tok, PROMPTS, max_new_tokens=40, stop_on_eos=False)
    seen = [set(ids[:20]) for ids in free.token_ids]
    eos = next(t for t in seen[0] if not all(t in s for s in seen))  # ends row 0 early, not every row
    model.generation_config.eos_token_id = eos
    try:
        res = foresight.generate(model, tok, PROMPTS, max_new_tokens=40)
        monkeypatch.setattr(FullPolicy, "selects_rows", False)
        whole = foresight.generate(model, tok, PROMPTS, max_new_tokens=40)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id
    assert calls and res.token_ids == whole.token_ids


@pytest.mark.parametrize("kw", [dict(seed=7), dict(seed=[1, 2, 3, 4], policy="h2o", budget=16, interval=4,
                                                   align="batch")])
def test_rows_stay_when_tokens_would_change(tiny_llama, calls, kw):
    """One generator shared by the batch (a dropped row would shift the others' draws), or a policy whose state
    cannot follow: every row stays to the end."""
    model, tok = tiny_llama
    eos = _common_token(model, tok, **kw)
    res = _generate(model, tok, eos, **kw)
    assert len({len(ids) for ids in res.token_ids}) > 1
    assert not calls


def test_select_rows_keeps_the_other_rows_logits(tiny_llama):
    model, tok = tiny_llama
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    rows = torch.tensor([0, 2])
    with torch.inference_mode():
        whole, part = BudgetedCache(model), BudgetedCache(model)
        for cache in (whole, part):
            model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True)
        part.select_rows(rows)
        step = torch.tensor([[5], [6], [7], [8]])
        nxt = pos[:, -1:] + 1
        m2 = torch.cat([mask, torch.ones(4, 1, dtype=mask.dtype)], -1)
        ref = model(input_ids=step, position_ids=nxt, attention_mask=m2, past_key_values=whole, use_cache=True).logits
        got = model(input_ids=step[rows], position_ids=nxt[rows], attention_mask=m2[rows], past_key_values=part,
                    use_cache=True).logits
    assert part.layers[0].keys.shape[0] == 2 and part.length == whole.length
    torch.testing.assert_close(got, ref[rows], rtol=1e-5, atol=1e-5)


def test_a_policy_with_row_state_refuses(tiny_llama):
    model, _ = tiny_llama
    cache = BudgetedCache(model, policy="h2o", budget=16, interval=4)
    assert not cache.selects_rows
    with pytest.raises(NotImplementedError, match="h2o"):
        cache.select_rows(torch.tensor([0]))
