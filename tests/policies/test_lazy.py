"""LazyEviction's two bookkeeping variants (``entry="published"`` default, ``entry="fresh"``).

A hand-computed example with known attention (views built by hand, so the attention is exact), a plain-Python
reference for both variants with and without a prompt driven through the real cache, and replay in pieces of
``W`` against replay token by token on the tiny models.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import foresight
from foresight.policies import make_policy
from tests.conftest import TINY, get_model
from tests.policies.test_policies import HKV, B, D, G, W, KeepRecorder, drive, kept, look_at, onehot_keys

ALPHA = 0.1


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def lazy(entry: str | None = None, **kwargs):
    return make_policy("lazy", **kwargs) if entry is None else make_policy("lazy", entry=entry, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Hand-computed example: one row, one KV head, one query head, alpha = 0.1
# ---------------------------------------------------------------------------------------------------------------

#: attention row of the query at each position over the entries 0..t (known, not computed from keys)
ROWS = {
    0: [1.0],
    1: [0.95, 0.05],  # prompt row: token 1 below alpha
    2: [0.5, 0.0, 0.5],
    3: [0.0, 0.6, 0.0, 0.4],
    4: [0.05, 0.0, 0.0, 0.0, 0.95],  # token 0 below alpha
}


def step_view(first: int, last: int, rows: dict[int, list[float]]) -> SimpleNamespace:
    """The view of one forward feeding positions ``first..last`` (rows in order, causal)."""
    n, q = last + 1, last + 1 - first
    probs = torch.zeros(1, 1, 1, q, n)
    for i, t in enumerate(range(first, last + 1)):
        probs[0, 0, 0, i, : t + 1] = torch.tensor(rows[t])
    return SimpleNamespace(layer_idx=0, probs=probs, positions=torch.arange(n).view(1, 1, n),
                           query_positions=torch.arange(first, last + 1).view(1, q))


def feed(policy, pieces, prompt_lengths=None, rows=ROWS):
    policy.reset(1, 1, torch.device("cpu"), num_groups=1, prompt_lengths=prompt_lengths)
    for first, last in pieces:
        policy.observe(step_view(first, last, rows))
    return policy


TOKEN_BY_TOKEN = [(t, t) for t in range(5)]
PIECES = {"token by token": TOKEN_BY_TOKEN, "prefill + decode": [(0, 1), (2, 2), (3, 3), (4, 4)],
          "prefill + one chunk": [(0, 1), (2, 4)], "one chunk": [(0, 4)], "split prompt": [(0, 0), (1, 3), (4, 4)]}

# Expected (last, mri, scores at t = 4). Published with prompt P = 2: prompt tokens enter with last = P - 1 = 1,
# rows 0 and 1 are not observed; decode token t enters with last = t - 1 and its own row activates it (mri = 1).
#   t=2 activates 0 (mri 2-1=1) and 2 (2-1=1); t=3 activates 1 (3-1=2) and 3 (1); t=4 activates 4 (1).
PUBLISHED_P2 = ([2, 3, 2, 3, 4], [1, 2, 1, 1, 1],
                [2 * sig(-3) + 1, 2 * sig(-1.5) + 2 * sig(-1), 2 * sig(-3) + 1, 2 * sig(-2) + 1, 2 * sig(-1) + 1])
# Published without a prompt (P = 0): every row is a decode step. Token 1 enters with last = 0 and its own row
# gives it only 0.05 < alpha, so the next activation (t=3) makes mri = 3.
PUBLISHED_P0 = ([2, 3, 2, 3, 4], [1, 3, 1, 1, 1],
                [2 * sig(-3) + 1, 2 * sig(-(1 + 1 / 3)) + 2 * sig(-2), 2 * sig(-3) + 1, 2 * sig(-2) + 1,
                 2 * sig(-1) + 1])
# Fresh: token t enters with last = t, so its own row leaves mri = 0; every row is observed, prompt ignored.
#   row 1 activates 0 (mri 1-0=1); t=2 activates 0 (1) and 2 (0); t=3 activates 1 (3-1=2) and 3 (0).
FRESH = ([2, 3, 2, 3, 4], [1, 2, 0, 0, 0],
         [2 * sig(-3) + 1, 2 * sig(-1.5) + 2 * sig(-1), 0.0, 0.0, 2 * sig(-1)])
CASES = {"published P=2": ("published", 2, PUBLISHED_P2), "published P=0": ("published", None, PUBLISHED_P0),
         "fresh": ("fresh", 2, FRESH), "fresh without prompt": ("fresh", None, FRESH)}


@pytest.mark.parametrize("pieces", list(PIECES), ids=str)
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_hand_computed_example(case, pieces):
    entry, plen, (last, mri, scores) = CASES[case]
    policy = feed(lazy(entry, alpha=ALPHA), PIECES[pieces], plen)
    assert policy.state.get(0, "last")[0, 0].tolist() == last
    assert policy.state.get(0, "mri")[0, 0].tolist() == mri
    got = policy.score(SimpleNamespace(layer_idx=0, num_candidates=5))[0, 0]
    torch.testing.assert_close(got, torch.tensor(scores), atol=1e-6, rtol=1e-6)


def test_the_variants_rank_once_attended_tokens_oppositely():
    """Tokens 2 and 3 were attended only by their own query: published keeps them, fresh evicts them first."""
    view = SimpleNamespace(layer_idx=0, num_candidates=5)
    pub = feed(lazy(alpha=ALPHA), TOKEN_BY_TOKEN, 2).score(view)[0, 0]
    fresh = feed(lazy("fresh", alpha=ALPHA), TOKEN_BY_TOKEN, 2).score(view)[0, 0]
    assert set(pub.topk(2).indices.tolist()) == {3, 4}  # newest, then the once-attended 3 (mri = 1)
    assert set(fresh.topk(2).indices.tolist()) == {0, 1}  # the two that recurred
    assert set((-fresh).topk(2).indices.tolist()) == {2, 3}  # ... and the once-attended go first
    assert pub[1] == pub.min()  # published: the token that recurred at interval 2 goes first


def test_a_token_recurring_every_5_steps_loses_to_once_attended_ones_under_published():
    """One-hot attention: every query looks at its own token, and every 5th also at token 3 instead."""
    n = 60
    targets = [None] * n
    for t in range(8, n, 5):
        targets[t] = 3
    fresh = drive(lazy("fresh"), onehot_keys(n), look_at(targets))
    pub = drive(lazy(), onehot_keys(n), look_at(targets))
    assert pub.events == fresh.events >= 4
    assert 3 in kept(fresh)  # fresh: the others have mri = 0, token 3 mri = 5
    assert 3 not in kept(pub)  # published: the others have mri = 1 (s2 = 1), token 3 s2 = 2σ(-4)


def test_published_does_not_observe_the_prompt():
    """With the prompt length given, what the prompt's own rows attend changes nothing."""
    other = {**ROWS, 1: [0.0, 1.0]}  # prompt row 1 now ignores token 0
    a = feed(lazy(alpha=ALPHA), TOKEN_BY_TOKEN, 2)
    b = feed(lazy(alpha=ALPHA), TOKEN_BY_TOKEN, 2, rows=other)
    for name in ("last", "mri"):
        assert torch.equal(a.state.get(0, name), b.state.get(0, name))
    # fresh observes the prompt: token 0 is now first re-activated at t=2, mri 2 instead of 1
    c = feed(lazy("fresh", alpha=ALPHA), TOKEN_BY_TOKEN, 2, rows=other)
    assert c.state.get(0, "mri")[0, 0].tolist() == [2, 2, 0, 0, 0]


def test_default_is_published():
    policy = make_policy("lazy")
    assert policy.entry == "published"
    assert policy.config()["entry"] == "published"
    assert policy.eps == 1e-5  # the published code's


def test_bad_entry_and_prompt_lengths_raise():
    with pytest.raises(ValueError, match="entry"):
        make_policy("lazy", entry="late")
    with pytest.raises(ValueError, match="prompt_lengths"):
        lazy().reset(2, 1, torch.device("cpu"), prompt_lengths=[3, 4, 5])
    with pytest.raises(ValueError, match="prompt_lengths"):
        lazy().reset(1, 1, torch.device("cpu"), prompt_lengths=[-1])


def test_long_prompt_is_observed_until_decoding_then_reset():
    """Inside a prompt longer than B + W, events rank by the prompt's rows (like P = 0); decoding resets it."""
    pieces = [(0, 1)]
    with_p, without = feed(lazy(alpha=ALPHA), pieces, 3), feed(lazy(alpha=ALPHA), pieces, None)
    for name in ("last", "mri"):  # rows 0 and 1 are prompt rows (P = 3): observed like P = 0 so far
        assert torch.equal(with_p.state.get(0, name), without.state.get(0, name))
    assert with_p.state.get(0, "mri")[0, 0].tolist() == [1, 0]  # the sink is not tied with the rest
    rows = {**ROWS, 2: [0.5, 0.0, 0.5], 3: [0.0, 0.0, 0.6, 0.4]}
    policy = feed(lazy(alpha=ALPHA), [(0, 1), (2, 3)], 3, rows=rows)  # row 2 prompt, row 3 the first decode step
    # reset at t=3: prompt tokens 0..2 -> last = 2, mri = 0; row 3 activates 2 (mri 3-2 = 1) and 3 (enters last 2)
    assert policy.state.get(0, "last")[0, 0].tolist() == [2, 2, 3, 3]
    assert policy.state.get(0, "mri")[0, 0].tolist() == [0, 0, 1, 1]


# ---------------------------------------------------------------------------------------------------------------
# Plain-Python reference through the real cache (random attention, evictions, prompts)
# ---------------------------------------------------------------------------------------------------------------


class NaiveLazy:
    """Both bookkeeping variants in plain Python, keyed by logical position, one dict per (row, KV head)."""

    def __init__(self, alpha: float, eps: float, entry: str, prompt: list[int]):
        self.alpha, self.eps, self.entry, self.prompt = alpha, eps, entry, prompt
        self.last: dict[tuple[int, int, int], int] = {}
        self.mri: dict[tuple[int, int, int], int] = {}
        self.decoding: set[tuple[int, int]] = set()

    def observe(self, probs, positions, query_positions):
        b, hkv, g, q, n = probs.shape
        for bi in range(b):
            p = self.prompt[bi] if self.entry == "published" else 0
            for h in range(hkv):
                for j in range(n):
                    pos = int(positions[bi, h, j])
                    if (bi, h, pos) not in self.last:
                        self.last[bi, h, pos] = pos if self.entry == "fresh" else pos - 1
                        self.mri[bi, h, pos] = 0
                for i in range(q):  # query rows in order, one step each
                    t = int(query_positions[bi, i])
                    if t >= p and (bi, h) not in self.decoding:  # first decode step: the published prefill state
                        self.decoding.add((bi, h))
                        for key in self.last:
                            if key[:2] == (bi, h) and key[2] < p:
                                self.last[key], self.mri[key] = p - 1, 0
                    for j in range(n):
                        if max(float(probs[bi, h, gg, i, j]) for gg in range(g)) >= self.alpha:
                            key = (bi, h, int(positions[bi, h, j]))
                            self.mri[key] = max(self.mri[key], t - self.last[key])
                            self.last[key] = t

    def score(self, key, t):
        last, mri = self.last[key], self.mri[key]
        s1 = 2 * sig(-(1 + (t - last) / (mri + self.eps)))
        return s1 + (0.0 if mri == 0 else 2 * sig(1 - mri))


def with_prompt(policy, prompt_lengths):
    """Make ``drive``'s ``policy.reset`` pass ``prompt_lengths`` (what ``replay(..., prompt_lengths=...)`` does)."""
    reset = policy.reset
    policy.reset = lambda *args, **kw: reset(*args, prompt_lengths=prompt_lengths, **kw)
    return policy


def random_attention(n: int, batch: int = 1, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, HKV, n, D, generator=g), torch.randn(batch, HKV * G, n, D, generator=g) * 0.6


@pytest.mark.parametrize("prompt", [None, [5], [30]], ids=["no prompt", "P=5", "P=30 (events inside)"])
@pytest.mark.parametrize("entry", ["published", "fresh"])
@pytest.mark.parametrize("chunk", [1, 3, W])
def test_bookkeeping_matches_naive_reference(chunk, entry, prompt):
    policy = with_prompt(lazy(entry, alpha=0.06), prompt)
    naive = NaiveLazy(0.06, policy.eps, entry, prompt or [0])
    checked, batched = [], []
    observe, observe_layers, score = policy.observe, policy.observe_layers, policy.score

    def check(positions):
        last, mri = policy.state.get(0, "last"), policy.state.get(0, "mri")
        for h in range(last.shape[1]):
            for j in range(last.shape[2]):
                key = (0, h, int(positions[0, h, j]))
                assert (last[0, h, j].item(), mri[0, h, j].item()) == (naive.last[key], naive.mri[key])

    per_layer = []

    def observe_both(view):
        per_layer.append(view.layer_idx)
        naive.observe(view.probs, view.positions, view.query_positions)
        observe(view)
        check(view.positions)

    def observe_layers_both(view):  # decode steps (one query row, no mask) come as a view of every layer
        per_layer.clear()
        observe_layers(view)
        if not per_layer:  # all layers at once (not handed back to observe layer by layer)
            naive.observe(view.probs[0], view.positions[0], view.query_positions)
            check(view.positions[0])
            batched.append(True)

    def score_both(view):
        s = score(view)
        t = int(view.positions.max())  # replay evicts right after the piece whose newest token is t
        for h in range(s.shape[1]):
            for j in range(s.shape[2]):
                key = (0, h, int(view.positions[0, h, j]))
                assert s[0, h, j].item() == pytest.approx(naive.score(key, t), abs=1e-6)
        checked.append(True)
        return s

    policy.observe, policy.observe_layers, policy.score = observe_both, observe_layers_both, score_both
    keys, queries = random_attention(70)
    cache = drive(policy, keys, queries, chunk=chunk)
    assert cache.events >= 5 and len(checked) == cache.events
    assert batched or chunk > 1  # token by token, every variant reaches the all-layers path
    mri = policy.state.get(0, "mri")
    assert (mri > 0).any() and (mri == 0).any()


@pytest.mark.parametrize("prompt", [None, [7, 30]])
@pytest.mark.parametrize("entry", ["published", "fresh"])
def test_chunked_state_equals_token_by_token(entry, prompt):
    keys, queries = random_attention(60, batch=2, seed=2)
    a = with_prompt(lazy(entry, alpha=0.05), prompt)
    b = with_prompt(lazy(entry, alpha=0.05), prompt)
    ca, cb = drive(a, keys, queries, chunk=W), drive(b, keys, queries, chunk=1)
    assert ca.events == cb.events > 0
    assert torch.equal(ca.layers[0].positions, cb.layers[0].positions)
    for name in ("last", "mri"):
        assert torch.equal(a.state.get(0, name), b.state.get(0, name))


def test_prompt_length_changes_published_only():
    keys, queries = random_attention(60, seed=3)
    runs = {}
    for entry in ("published", "fresh"):
        for prompt in (None, [20]):
            policy = with_prompt(lazy(entry, alpha=0.05), prompt)
            drive(policy, keys, queries)
            runs[entry, prompt is None] = policy.state.get(0, "mri")
    assert torch.equal(runs["fresh", True], runs["fresh", False])
    assert not torch.equal(runs["published", True], runs["published", False])
    assert not torch.equal(runs["published", True], runs["fresh", True])


# ---------------------------------------------------------------------------------------------------------------
# End to end: replay in pieces of W equals replay token by token, both variants, with prompts
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["published", "fresh"])
@pytest.mark.parametrize("model_name", TINY)
def test_replay_chunked_equals_token_by_token(model_name, entry):
    model, _ = get_model(model_name)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(5, 200, (46,), generator=g).tolist(), torch.randint(5, 200, (41,), generator=g).tolist()]
    prompts = [9, 29]  # the second prompt is longer than B + W: evictions inside the prompt
    runs = []
    for chunk in (None, 1):
        policy = lazy(entry)
        rec = KeepRecorder(policy)
        res = foresight.replay(model, seqs, policy=policy, budget=B, interval=W, chunk=chunk, prompt_lengths=prompts)
        runs.append((res, rec, policy))
    (a, ra, pa), (b, rb, pb) = runs
    assert len(ra.keeps) == len(rb.keeps) > 0
    for ka, kb in zip(ra.keeps, rb.keeps):
        assert torch.equal(ka, kb)
    for layer in range(len(pa.state.tensors)):
        for name in ("last", "mri"):
            assert torch.equal(pa.state.get(layer, name), pb.state.get(layer, name))
    torch.testing.assert_close(a.ce, b.ce, atol=1e-4, rtol=1e-4, equal_nan=True)
