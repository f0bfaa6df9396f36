"""One eviction schedule for every prompt length, and the cache as a drop-in for ``model.generate``.

For prompts shorter than B, equal to B, between B and B+W, longer than B+W and longer than 3B, every policy that
runs at decode time must (a) give the same logits whether a trace is replayed in W-pieces or token by token, and
(b) greedily generate exactly what replay of its own output predicts. The cache fires its own events, so
``transformers``' ``model.generate`` with a :class:`BudgetedCache` must produce ``foresight.generate``'s tokens.
"""

from __future__ import annotations

import pytest
import torch
from transformers import pipeline

import foresight
from foresight.cache import BudgetedCache
from foresight.errors import ForesightError
from foresight.policies import make_policy, policy_names
from foresight.schedule import next_event, replay_schedule
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model

B, W = 16, 4
PROMPT_LENGTHS = [10, B, B + 2, B + W + 3, 3 * B + 5]  # P < B, P = B, B < P < B+W, P > B+W, P > 3B
NEW = 24
#: Every registered policy that runs at decode time (golden replays labels of a known trace only).
DECODE_POLICIES = [p for p in policy_names() if p != "golden"]


def _policy(name: str, model):
    if name == "learned":
        cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W,
                           feature_set=("key", "value", "attn", "age"), hidden=8)
        return make_policy("learned", scorer=Scorer(cfg, seed=0))
    if name == "caote":
        return make_policy("caote:h2o")
    if name == "paged":
        return make_policy("paged", block_size=W)
    return make_policy(name)


def _prompt(model, length: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed + length)
    return torch.randint(0, min(model.config.vocab_size, 250), (length,), generator=g).tolist()


def test_event_points_depend_on_the_token_count_only():
    assert [next_event(f, 16, 4) for f in (0, 19, 20, 21, 24, 25)] == [20, 20, 24, 24, 28, 28]
    assert next_event(5, None, None) is None
    assert next_event(0, 16, 4, offset=30) == 50  # a protected prompt of 30 tokens sits on top of B
    pieces = replay_schedule(61, 16, 4, chunk=100)
    assert [e for _, e, fire in pieces if fire] == [20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60]
    with pytest.raises(ValueError, match="chunk"):
        replay_schedule(10, 16, 4, chunk=-3)


@pytest.mark.parametrize("name", DECODE_POLICIES)
def test_chunked_replay_equals_token_by_token_and_generation(name):
    model, tok = get_model("tiny-llama")
    seqs = []
    for plen in PROMPT_LENGTHS:
        gen = foresight.generate(model, tok, [_prompt(model, plen)], policy=_policy(name, model), budget=B,
                                 interval=W, max_new_tokens=NEW, stop_on_eos=False)
        seqs.append(gen.sequences[0].tolist())
        assert len(seqs[-1]) == plen + NEW
        if name != "full":  # decoding fed len - 1 tokens; events at B+W, B+2W, ... of that count
            assert gen.stats["evictions"] == sum(f for *_, f in replay_schedule(plen + NEW - 1, B, W))
    # One ragged batch: events depend on the token count only, and right padding only follows real tokens.
    # (random draws one tensor per batch, so its draws depend on the batch: replay its rows one by one.)
    batches = [[s] for s in seqs] if name == "random" else [seqs]
    width = max(map(len, seqs))
    logits = {}
    for chunk in (None, 1):
        rows = torch.empty(len(seqs), width, model.config.vocab_size)
        first = 0
        for batch in batches:

            def hook(start, end, lg, rows=rows, first=first):
                rows[first : first + len(lg), start:end] = lg

            foresight.replay(model, batch, policy=_policy(name, model), budget=B, interval=W, chunk=chunk,
                             on_logits=hook)
            first += len(batch)
        logits[chunk] = rows
    for i, (plen, seq) in enumerate(zip(PROMPT_LENGTHS, seqs)):
        n = len(seq)
        torch.testing.assert_close(logits[None][i, :n], logits[1][i, :n], atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"{name} P={plen}: {m}")
        # greedy generation is the argmax of replay of its own output, prompts longer than B included
        assert logits[1][i, plen - 1 : n - 1].argmax(-1).tolist() == seq[plen:], (name, plen)


@pytest.mark.parametrize(
    "name,model_name",
    [(p, "tiny-llama") for p in DECODE_POLICIES] + [(p, "tiny-qwen3") for p in ("h2o", "lazy", "learned")],
)
def test_hf_generate_with_budgeted_cache_matches_foresight_generate(name, model_name):
    model, tok = get_model(model_name)
    prompts = [tok.decode(_prompt(model, 3 * B + 5)), "Hi", "What is 2+2? Think."]
    tok.padding_side = "left"
    for batch in (prompts[:1], prompts):  # batch 1 (prompt longer than 3B) and a left-padded batch
        # model.generate runs a padded batch on one schedule counted in padded positions: align="batch"
        ours = foresight.generate(model, tok, batch, policy=_policy(name, model), budget=B, interval=W,
                                  max_new_tokens=NEW, stop_on_eos=False, align="batch")
        enc = tok(batch, return_tensors="pt", padding=True)
        cache = BudgetedCache(model, policy=_policy(name, model), budget=B, interval=W)
        out = model.generate(**enc, past_key_values=cache, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)
        assert torch.equal(out, ours.sequences), (name, model_name, len(batch))
        assert cache.stats()["evictions"] == ours.stats["evictions"]
        if name != "full":
            assert max(cache.stats()["peak_entries"]) <= enc["input_ids"].shape[1] + B + W


@pytest.mark.parametrize("name", [p for p in DECODE_POLICIES if p != "random"])  # random draws per batch shape
def test_rows_of_different_lengths_evict_on_their_own_schedule(name):
    """generate(align="rows"), the default, gives every row of a mixed-length batch exactly its own generation."""
    model, tok = get_model("tiny-llama")
    prompts = [_prompt(model, n, seed=1) for n in (9, B + W + 3, 9, 3 * B + 5)]
    kw = dict(budget=B, interval=W, max_new_tokens=NEW, stop_on_eos=False, do_sample=True, temperature=0.9)
    both = foresight.generate(model, tok, prompts, policy=_policy(name, model), seed=[5, 6, 7, 8], **kw)
    for i, p in enumerate(prompts):
        alone = foresight.generate(model, tok, [p], policy=_policy(name, model), seed=[5 + i], **kw)
        assert both.token_ids[i] == alone.token_ids[0], (name, i)
        assert both.sequences[i, -NEW:].tolist() == alone.sequences[0, -NEW:].tolist()
    assert both.prompt_lengths == [len(p) for p in prompts]
    assert both.stats.get("groups") == (None if name == "full" else 3)  # the full cache needs no grouping


def test_hf_sampling_and_pipeline_through_the_cache():
    model, tok = get_model("tiny-llama")
    tok.padding_side = "left"
    enc = tok(["Hello there", "Hi"], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    cache = BudgetedCache(model, policy="h2o", budget=B, interval=W)
    out = model.generate(**enc, past_key_values=cache, do_sample=True, top_k=20, max_new_tokens=60,
                         min_new_tokens=60)
    assert out.shape == (2, enc["input_ids"].shape[1] + 60)
    assert max(cache.stats()["peak_entries"]) <= B + W and cache.stats()["evictions"] > 0
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    cache = BudgetedCache(model, policy="streaming_llm", budget=B, interval=W)
    text = pipe("Hello", past_key_values=cache, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    assert isinstance(text[0]["generated_text"], str)
    assert cache.stats()["evictions"] > 0 and max(cache.stats()["peak_entries"]) <= B + W


def test_model_is_unchanged_after_a_budgeted_forward():
    """The hooks route attention only while a BudgetedCache drives the forward; plain calls stay plain SDPA."""
    model, tok = get_model("tiny-llama")
    ids = torch.tensor([_prompt(model, 40)])
    ref = model(input_ids=ids).logits
    impl = model.config._attn_implementation
    model.generate(ids, past_key_values=BudgetedCache(model, policy="h2o", budget=B, interval=W), max_new_tokens=5)
    assert model.config._attn_implementation == impl
    torch.testing.assert_close(model(input_ids=ids).logits, ref)


def test_a_forward_crossing_an_event_needs_last_logits_only():
    model, _ = get_model("tiny-llama")
    cache = BudgetedCache(model, policy="h2o", budget=B, interval=W)
    with pytest.raises(ForesightError, match="would cross the eviction event at token 20"):
        model(input_ids=torch.tensor([_prompt(model, 30)]), past_key_values=cache)
    # a protected prompt is never cut or evicted, so any forward over it is fine
    cache = BudgetedCache(model, policy="h2o", budget=B, interval=W, protect_prompt=True)
    logits = model(input_ids=torch.tensor([_prompt(model, 30)]), past_key_values=cache).logits
    assert logits.shape[1] == 30 and cache.length == 30 and cache.events == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["h2o", "lazy", "streaming_llm"])
def test_hf_generate_with_budgeted_cache_on_smollm2(smollm2, name):
    model, tok = smollm2
    prompt = tok.apply_chat_template([{"role": "user", "content": "Explain step by step how to compute 12*7."}],
                                     tokenize=False, add_generation_prompt=True)
    enc = tok([prompt], return_tensors="pt")
    assert enc["input_ids"].shape[1] > 32 + 8  # the prompt crosses events: chunked prefill on both sides
    ours = foresight.generate(model, tok, [prompt], policy=name, budget=32, interval=8, max_new_tokens=48,
                              stop_on_eos=False)
    cache = BudgetedCache(model, policy=name, budget=32, interval=8)
    out = model.generate(**enc, past_key_values=cache, do_sample=False, max_new_tokens=48, min_new_tokens=48)
    assert torch.equal(out, ours.sequences)
    assert max(cache.stats()["peak_entries"]) == 40 and cache.stats()["evictions"] == ours.stats["evictions"]
