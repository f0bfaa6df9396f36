"""Finished rows leave the batch (``BudgetedCache.select_rows``): the other rows' logits and tokens are unchanged."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import foresight
from foresight import generation
from foresight.cache import BudgetedCache
from foresight.policies import make_policy, policy_names
from foresight.policies.full import FullPolicy
from foresight.scorer import Scorer, ScorerConfig

PROMPTS = ["Hello world, this is a longer test prompt.", "Hi", "What is 2+2? Think.", "One more prompt here"]
PAIRS = PROMPTS[:2] * 2  # two groups of two equal-length prompts (align="rows" decodes each group alone)


def _common_token(model, tok, prompts=PROMPTS, **kw) -> int:
    """A token most rows sample within a few steps (as EOS, rows finish at different times)."""
    kw = {"seed": [1, 2, 3, 4], **kw}
    free = foresight.generate(model, tok, prompts, max_new_tokens=40, stop_on_eos=False, do_sample=True,
                              temperature=1.5, **kw)
    counts = Counter(t for ids in free.token_ids for t in set(ids))
    return counts.most_common(1)[0][0]


def _generate(model, tok, eos: int, prompts=PROMPTS, **kw):
    model.generation_config.eos_token_id = eos
    try:
        return foresight.generate(model, tok, prompts, max_new_tokens=60, do_sample=True, temperature=1.5, **kw)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id


class Spy:
    """What ``select_rows`` kept, call by call (``counts``), and per cache, in order, every eviction's kept
    positions (..., batch, Hkv, k) and the policy's scores (..., batch, Hkv, candidates), and every ``select_rows``
    (``log``)."""

    def __init__(self, monkeypatch):
        self.counts: list[int] = []
        self.log: dict[int, list] = {}
        self._caches: list = []  # alive, so that no two caches of a run share an id
        select, kept = BudgetedCache.select_rows, BudgetedCache._kept

        def select_spy(cache, rows):
            self.counts.append(len(rows))
            self._entry(cache).append(("select", rows.tolist()))
            return select(cache, rows)

        def kept_spy(cache, view, scores, select):
            keep = kept(cache, view, scores, select)
            self._entry(cache).append(("keep", (view.positions.gather(-1, keep), scores)))
            return keep

        monkeypatch.setattr(BudgetedCache, "select_rows", select_spy)
        monkeypatch.setattr(BudgetedCache, "_kept", kept_spy)
        monkeypatch.setattr(generation, "EOS_READ_EVERY", 2)

    def _entry(self, cache) -> list:
        if id(cache) not in self.log:
            self._caches.append(cache)
        return self.log.setdefault(id(cache), [])

    def restart(self) -> dict:
        """Start a new run; returns the last run's log."""
        log, self.log, self.counts, self._caches = self.log, {}, [], []
        return log


def _same_evictions(dropped: dict, whole: dict) -> None:
    """Every eviction of the run that dropped rows scored and kept, in the rows still decoded, what the run that
    decoded every row to the end scored and kept in those rows."""
    assert len(dropped) == len(whole)  # one cache per group of rows
    for d, w in zip(dropped.values(), whole.values()):
        ref = [t for kind, t in w if kind == "keep"]
        assert ref and len(ref) == sum(kind == "keep" for kind, _ in d)
        active, i = None, 0
        for kind, t in d:
            if kind == "select":
                active = t if active is None else [active[j] for j in t]
                continue
            rows = list(range(ref[i][0].shape[-3])) if active is None else active
            assert torch.equal(t[0], ref[i][0][..., rows, :, :])
            torch.testing.assert_close(t[1], ref[i][1][..., rows, :, :], rtol=1e-5, atol=1e-6)
            i += 1


@pytest.fixture
def calls(monkeypatch) -> Spy:
    return Spy(monkeypatch)


def test_dropping_finished_rows_changes_no_token(tiny_llama, calls, monkeypatch):
    model, tok = tiny_llama
    eos = _common_token(model, tok)
    dropped = _generate(model, tok, eos, seed=[1, 2, 3, 4])
    assert calls.counts and calls.counts == sorted(calls.counts, reverse=True) and calls.counts[-1] < len(PROMPTS)
    lengths = sorted(len(ids) for ids in dropped.token_ids)
    assert lengths[0] < lengths[-1] - 2  # rows did finish at different times
    monkeypatch.setattr(FullPolicy, "selects_rows", False)
    calls.restart()
    whole = _generate(model, tok, eos, seed=[1, 2, 3, 4])
    assert not calls.counts
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
    assert calls.counts and res.token_ids == whole.token_ids


@pytest.mark.parametrize("kw", [dict(seed=7), dict(seed=[1, 2, 3, 4], policy="random", budget=16, interval=4,
                                                   align="batch")])
def test_rows_stay_when_tokens_would_change(tiny_llama, calls, kw):
    """One generator shared by the batch (a dropped row would shift the others' draws), or a policy whose state
    cannot follow: every row stays to the end."""
    model, tok = tiny_llama
    eos = _common_token(model, tok, **kw)
    res = _generate(model, tok, eos, **kw)
    assert len({len(ids) for ids in res.token_ids}) > 1
    assert not calls.counts


def _policy(name: str, model, **kw):
    if name == "learned":
        cfg = ScorerConfig(foresight.model_fingerprint(model), budget=16, interval=4,
                           feature_set=("prekey", "value", "attn", "age", "recency"), hidden=8)
        return make_policy("learned", scorer=Scorer(cfg, seed=0), **kw)
    return make_policy(name, **({"block_size": 2} if name == "paged" else {}), **kw)


# every policy whose state follows select_rows (learned: under top-k, its default selection)
DROPPING = ["learned"] + [n for n in policy_names() if n not in ("full", "golden", "learned") and make_policy(n).selects_rows]


def test_every_decode_policy_but_random_drops_rows():
    assert set(DROPPING) == set(policy_names()) - {"full", "golden", "random"}


def _drops_as_decoded_whole(model, tok, calls: Spy, monkeypatch, policy, prompts=PROMPTS, **kw) -> None:
    """Generate with finished rows dropped, then with every row decoded to the end (``policy()`` builds the policy
    each time): rows were dropped, evictions happened, and the tokens, scores and evictions are the same."""
    eos = _common_token(model, tok, prompts)
    kw = dict(budget=16, interval=4, seed=[1, 2, 3, 4], prompts=prompts, **kw)
    dropped = _generate(model, tok, eos, policy=policy(), **kw)
    assert calls.counts and dropped.stats["evictions"] > 0
    dropped_log = calls.restart()
    monkeypatch.setattr(BudgetedCache, "selects_rows", property(lambda self: False))
    whole = _generate(model, tok, eos, policy=policy(), **kw)
    assert not calls.counts
    _same_evictions(dropped_log, calls.log)
    assert dropped.token_ids == whole.token_ids


@pytest.mark.parametrize("align", ["batch", "rows"])
@pytest.mark.parametrize("name", DROPPING)
def test_evicting_policies_drop_rows_with_the_same_tokens(tiny_llama, calls, monkeypatch, name, align):
    """Every policy that says its state follows select_rows: the same tokens, evictions included, as with every row
    decoded to the end (prompts of several lengths in one padded batch, or groups of equal length)."""
    model, tok = tiny_llama
    _drops_as_decoded_whole(model, tok, calls, monkeypatch, lambda: _policy(name, model),
                            prompts=PROMPTS if align == "batch" else PAIRS, align=align)


@pytest.mark.parametrize("extra", [dict(protect_prompt=True), dict(sinks=2)])
def test_a_protected_prompt_and_sinks_follow_the_rows(tiny_llama, calls, monkeypatch, extra):
    """The protected prompt's per-row widths (a padded batch) and the sinks stay with their rows."""
    model, tok = tiny_llama
    _drops_as_decoded_whole(model, tok, calls, monkeypatch, lambda: make_policy("h2o"), align="batch", **extra)


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
    cache = BudgetedCache(model, policy="random", budget=16, interval=4)
    assert not cache.selects_rows
    with pytest.raises(NotImplementedError, match="random"):
        cache.select_rows(torch.tensor([0]))
