"""The budgeted runtime against brute-force references: HF generate, one full forward, step-by-step decoding."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import foresight
from foresight.errors import ForesightError
from foresight.policies import make_policy
from foresight.policies.streaming_llm import StreamingLLMPolicy
from foresight.runtime import CacheConfig, full_forward_ce, replay_schedule
from tests.conftest import get_model

PROMPTS = ["Hello world, this is a longer test prompt.", "Hi", "What is 2+2? Think."]


def _hf_generate(model, tok, prompts, n):
    enc = tok(prompts, return_tensors="pt", padding=True)
    return model.generate(**enc, do_sample=False, max_new_tokens=n)


@pytest.mark.parametrize("batch", [1, 3])
def test_full_policy_matches_hf_generate(tiny, batch):
    model, tok = tiny
    prompts = PROMPTS[:batch]
    ref = _hf_generate(model, tok, prompts, 40)
    ours = foresight.generate(model, tok, prompts, policy="full", max_new_tokens=40)
    assert torch.equal(ours.sequences, ref)
    assert ours.stats["evictions"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3])
def test_full_policy_matches_hf_generate_smollm2(smollm2, batch):
    model, tok = smollm2
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in ["What is 12 times 7?", "Name a prime number.", "Explain what a derivative is in one sentence."]
    ][:batch]
    ref = _hf_generate(model, tok, prompts, 24)
    ours = foresight.generate(model, tok, prompts, policy="full", max_new_tokens=24)
    assert torch.equal(ours.sequences, ref)


@dataclass
class RecordingPolicy(StreamingLLMPolicy):
    """streaming_llm that records what the runtime shows it (cache lengths, positions) at every step."""

    observes = True

    def reset(self, batch_size, num_layers, device, **meta):
        self.lengths, self.after_evict, self.query_pos, self.cache_pos = [], [], [], []

    def observe(self, view):
        if view.layer_idx == 0:
            self.lengths.append(view.keys.shape[2])
            self.query_pos.append(view.query_positions.clone())
            self.cache_pos.append(view.positions.clone())

    def on_evict(self, layer_idx, keep):
        self.after_evict.append(keep.shape[-1])


@pytest.mark.parametrize("budget,interval", [(16, 4), (24, 8)])
def test_budget_invariants_during_generation(tiny, budget, interval):
    model, tok = tiny
    policy = RecordingPolicy(sinks=2)
    res = foresight.generate(
        model, tok, ["abc"], policy=policy, budget=budget, interval=interval, max_new_tokens=300, stop_on_eos=False
    )
    assert len(res.token_ids[0]) == 300
    assert max(policy.lengths) <= budget + interval
    assert max(res.stats["peak_entries"]) == budget + interval
    assert set(policy.after_evict) == {budget}
    assert res.stats["evictions"] == len(policy.after_evict) // model.config.num_hidden_layers > 0
    # logical positions: the k-th decode step feeds position prompt_len + k, whatever the cache length
    plen = res.prompt_lengths[0]
    qpos = [int(p[0, -1]) for p in policy.query_pos]
    assert qpos == list(range(plen - 1, plen - 1 + len(qpos)))
    for pos in policy.cache_pos:  # kept entries stay in temporal order, no duplicates
        assert torch.all(pos[..., 1:] > pos[..., :-1])
    # streaming_llm keeps the sinks and the most recent tokens
    last = policy.cache_pos[-1][0, 0]
    assert last[:2].tolist() == [0, 1]


def test_long_generation_stays_bounded(tiny_llama):
    model, tok = tiny_llama
    res = foresight.generate(
        model, tok, ["x"], policy="random", budget=32, interval=8, max_new_tokens=1000, stop_on_eos=False
    )
    assert len(res.token_ids[0]) == 1000
    assert max(res.stats["peak_entries"]) <= 40
    assert res.stats["final_entries"] <= 40


def test_prompt_longer_than_budget_is_prefilled_in_schedule_pieces(tiny_llama):
    """A long prompt is cut at the event points B+W, B+2W, ... (chunked prefill), like replay cuts it."""
    model, tok = tiny_llama
    policy = RecordingPolicy()
    prompt = "a long prompt " * 6
    res = foresight.generate(model, tok, [prompt], policy=policy, budget=16, interval=4, max_new_tokens=3)
    plen = res.prompt_lengths[0]
    assert plen > 16 + 4
    fired = [e for _, e, f in replay_schedule(plen, 16, 4, chunk=plen) if f]
    # prefill pieces: [0, 20), then one W-piece per event, then the tail; each piece sees B + its own tokens
    assert policy.lengths[0] == 20 and policy.lengths[1 : len(fired)] == [20] * (len(fired) - 1)
    assert res.stats["evictions"] == len(fired) + (plen + 2 >= fired[-1] + 4)
    assert policy.cache_pos[-1][0, 0, -1].item() == plen + 1  # logical position of the last fed token


def test_batch_generation_with_padding_and_budget(tiny):
    model, tok = tiny
    res = foresight.generate(
        model, tok, PROMPTS, policy="streaming_llm", budget=16, interval=4, max_new_tokens=50, stop_on_eos=False
    )
    assert res.sequences.shape[0] == 3
    assert all(len(t) == 50 for t in res.token_ids)
    assert max(res.stats["peak_entries"]) <= max(res.prompt_lengths) + 1


def test_sampling_is_seeded(tiny_llama):
    model, tok = tiny_llama
    kw = dict(max_new_tokens=30, do_sample=True, temperature=0.8, top_p=0.9, top_k=50, stop_on_eos=False)
    a = foresight.generate(model, tok, PROMPTS, seed=3, **kw)
    b = foresight.generate(model, tok, PROMPTS, seed=3, **kw)
    c = foresight.generate(model, tok, PROMPTS, seed=4, **kw)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_stops_on_eos(tiny_llama):
    model, tok = tiny_llama
    free = foresight.generate(model, tok, ["Hi"], max_new_tokens=20, stop_on_eos=False)
    eos_at = free.token_ids[0][5]
    model.generation_config.eos_token_id = eos_at
    try:
        res = foresight.generate(model, tok, ["Hi"], max_new_tokens=20)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id
    first = free.token_ids[0].index(eos_at)
    assert res.token_ids[0] == free.token_ids[0][: first + 1]


def test_replay_full_matches_one_forward(tiny):
    model, _ = tiny
    ids = torch.randint(0, 250, (2, 150), generator=torch.Generator().manual_seed(0))
    rep = foresight.replay(model, ids, policy="full", interval=16)
    ref = full_forward_ce(model, ids)
    torch.testing.assert_close(rep.ce, ref, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(rep.entropy).all() and (rep.entropy >= 0).all()


def test_full_replay_uses_full_pieces_and_agrees_with_w_pieces(tiny_llama, monkeypatch):
    """A policy that neither evicts nor observes is fed in FULL_PIECE pieces (ragged rows, padding inside a
    piece), with the CE of W-token pieces; an evicting policy keeps pieces of at most W."""
    import foresight.runtime as runtime

    model, _ = tiny_llama
    monkeypatch.setattr(runtime, "FULL_PIECE", 64)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 250, (150,), generator=g).tolist(), torch.randint(0, 250, (97,), generator=g).tolist()]
    seen: dict[str, list] = {"full": [], "streaming_llm": []}
    big = foresight.replay(model, seqs, "full", interval=16, on_logits=lambda s, e, _: seen["full"].append((s, e)))
    small = foresight.replay(model, seqs, "full", interval=16, chunk=16)
    assert seen["full"] == [(0, 64), (64, 128), (128, 150)]
    torch.testing.assert_close(big.ce, small.ce, atol=1e-4, rtol=1e-4, equal_nan=True)
    assert torch.isnan(big.ce[1, 96:]).all() and torch.isfinite(big.ce[1, :96]).all()
    foresight.replay(model, seqs, "streaming_llm", budget=40, interval=16,
                     on_logits=lambda s, e, _: seen["streaming_llm"].append((s, e)))
    assert max(e - s for s, e in seen["streaming_llm"]) == 16


@pytest.mark.parametrize("policy", ["streaming_llm", "random"])
def test_chunked_replay_equals_token_by_token(tiny, policy):
    model, _ = tiny
    ids = torch.randint(0, 250, (2, 120), generator=torch.Generator().manual_seed(1))
    chunked = foresight.replay(model, ids, policy=policy, budget=20, interval=6)
    stepwise = foresight.replay(model, ids, policy=policy, budget=20, interval=6, chunk=1)
    torch.testing.assert_close(chunked.ce, stepwise.ce, atol=1e-4, rtol=1e-4)
    assert chunked.stats["evictions"] == stepwise.stats["evictions"] == (120 - 26) // 6 + 1


def test_replay_reproduces_budgeted_generation(tiny):
    """Greedy generation under eviction and teacher-forced replay of its output see the same caches."""
    model, tok = tiny
    gen = foresight.generate(
        model, tok, ["ab"], policy="streaming_llm", budget=16, interval=4, max_new_tokens=60, stop_on_eos=False
    )
    seq = gen.sequences[0]
    plen = gen.prompt_lengths[0]
    argmax = torch.empty(len(seq), dtype=torch.long)

    def hook(start, end, logits):
        argmax[start:end] = logits[0].argmax(-1)

    foresight.replay(model, seq[None], policy="streaming_llm", budget=16, interval=4, chunk=1, on_logits=hook)
    assert torch.equal(argmax[plen - 1 : -1], seq[plen:])


def test_replay_handles_ragged_batches(tiny_llama):
    model, _ = tiny_llama
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 250, (90,), generator=g).tolist(), torch.randint(0, 250, (60,), generator=g).tolist()
    both = foresight.replay(model, [a, b], policy="streaming_llm", budget=20, interval=5)
    alone = foresight.replay(model, [b], policy="streaming_llm", budget=20, interval=5)
    torch.testing.assert_close(both.ce[1, :59], alone.ce[0, :59], atol=1e-4, rtol=1e-4)
    assert torch.isnan(both.ce[1, 59:]).all()


def test_replay_schedule_cuts_at_events():
    pieces = replay_schedule(100, budget=20, interval=8)
    ends = [e for _, e, fire in pieces if fire]
    assert ends == [28, 36, 44, 52, 60, 68, 76, 84, 92, 100]
    assert all(e - s <= 8 for s, e, _ in pieces)
    assert pieces[0][0] == 0 and pieces[-1][1] == 100
    assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(budget=0, interval=1), "budget"),
        (dict(budget=-4, interval=1), "budget"),
        (dict(budget=16, interval=0), "interval"),
        (dict(budget=16, interval=16), "smaller than budget"),
        (dict(budget=16, interval=4, sinks=13), "sinks"),
    ],
)
def test_bad_cache_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(**kwargs)


def test_generate_rejects_bad_input(tiny_llama):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="unknown policy"):
        foresight.generate(model, tok, ["x"], policy="nope", budget=16, interval=4)
    with pytest.raises(ValueError, match="smaller than budget"):
        foresight.generate(model, tok, ["x"], policy="random", budget=8, interval=8)
    with pytest.raises(ValueError, match="top_p"):
        foresight.generate(model, tok, ["x"], do_sample=True, top_p=0.0)
    with pytest.raises(ValueError, match="no hyperparameter"):
        foresight.generate(model, tok, ["x"], policy="streaming_llm", budget=8, interval=2,
                           policy_kwargs={"bogus": 1})
    # ids past the embedding: an IndexError (exit 1) on the CPU, a device-side assert on CUDA
    vocab = model.get_input_embeddings().num_embeddings
    with pytest.raises(ForesightError, match=rf"token id {vocab + 5} is outside the model's vocabulary"):
        foresight.generate(model, tok, [[1, vocab + 5]], max_new_tokens=2)
    with pytest.raises(ForesightError, match="token id -1 is outside"):
        foresight.replay(model, [[1, 2, -1, 3]])
    with pytest.raises(ForesightError, match="token ids must be integers"):
        foresight.replay(model, torch.rand(1, 10))
    # hyperparameters beside a policy instance were dropped: h2o ran with its own group_reduce
    with pytest.raises(ValueError, match="policy_kwargs only apply to a policy given by name"):
        foresight.generate(model, tok, ["x"], policy=make_policy("h2o"), budget=8, interval=2,
                           policy_kwargs={"group_reduce": "max"})
    with pytest.raises(ValueError, match="policy_kwargs only apply to a policy given by name"):
        foresight.replay(model, [[1, 2, 3]], policy=make_policy("h2o"), budget=8, interval=2,
                         policy_kwargs={"group_reduce": "max"})


def test_checked_policy_names_the_flag_and_checks_every_cache():
    from foresight.errors import ForesightError
    from foresight.policies import checked_policy

    assert checked_policy("paged", [(64, 16), (128, 32)], "--policies 'paged'").block_size == 16
    for name, caches, kwargs, match in (
        ("nope", [], {}, r"^--policies 'nope': unknown policy 'nope'"),
        ("paged", [(64, 16), (64, 8)], {}, r"^--policies 'paged': paged: block_size \(16\) must divide .*\(8\)"),
        ("h2o", [], {"bogus": 1}, r"^--policies 'h2o': policy 'h2o' has no hyperparameter\(s\) bogus"),
        ("paged", [], {"block_size": 0}, r"^--policies 'paged': .*block_size"),
    ):
        with pytest.raises(ForesightError, match=match):
            checked_policy(name, caches, f"--policies {name!r}", **kwargs)


def test_unsupported_architecture_is_a_clear_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    from foresight.runtime import UnsupportedModelError, check_supported

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match="supported: llama"):
        check_supported(model)


def test_models_have_gqa_and_qk_norm():
    llama, _ = get_model("tiny-llama")
    qwen3, _ = get_model("tiny-qwen3")
    for m in (llama, qwen3):
        assert m.config.num_attention_heads > m.config.num_key_value_heads
    assert hasattr(qwen3.model.layers[0].self_attn, "q_norm")


def test_a_deep_copy_of_a_served_model_routes_its_own_attention():
    """copy.deepcopy of a model a budgeted cache has served copies its forward hooks; the copy's attention must go
    through the runtime under its own configs (h2o observes it), not the original's."""
    import copy

    from foresight.tiny_models import build_tiny_model

    model, tok = build_tiny_model("tiny-llama")
    rows = torch.randint(3, 200, (2, 11), generator=torch.Generator().manual_seed(0)).tolist()
    kw = dict(policy="h2o", budget=16, interval=4, max_new_tokens=30, stop_on_eos=False)
    first = foresight.generate(model, tok, rows, **kw)
    twin = copy.deepcopy(model)
    again = foresight.generate(twin, tok, rows, **kw)
    assert torch.equal(again.sequences, first.sequences) and again.stats == first.stats
    ref = foresight.replay(model, rows, "h2o", 16, 4)
    got = foresight.replay(twin, rows, "h2o", 16, 4)
    torch.testing.assert_close(got.ce, ref.ce, equal_nan=True)


@pytest.mark.parametrize("lengths", [[5, 9, 5, 2, 9, 7, 1], [9, 1, 1, 1, 1, 1, 1], [3, 3, 3, 8, 1, 3, 3]])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_length_batches_partition_longest_first(lengths, size):
    """Every index once, in the fewest batches of at most ``size`` (at most one short), non-increasing lengths
    along the order, equal lengths in their given order; the padded tokens are the fewest of any batching into as
    many batches (brute force over every order cut into batches)."""
    from itertools import permutations

    from foresight.runtime import length_batches

    batches = length_batches(lengths, size)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert len(batches) == -(-len(lengths) // size) and sum(len(b) < size for b in batches) <= 1
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for i, j in zip(flat, flat[1:]):  # ties keep their order
        assert lengths[i] > lengths[j] or i < j

    def padded(groups):
        return sum(max(lengths[i] for i in g) * len(g) for g in groups)

    def cut(order):  # full batches, the short one last: every partition into this many batches, up to their order
        return [order[s:s + size] for s in range(0, len(order), size)]

    assert padded(batches) == min(padded(cut(p)) for p in permutations(range(len(lengths))))


def test_length_batches_refuses_an_empty_batch():
    from foresight.runtime import length_batches

    assert length_batches([], 4) == []
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        length_batches([3], 0)
