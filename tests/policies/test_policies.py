"""Heuristic eviction policies: every policy end to end on tiny models, hand-built cases with a known answer.

Hand-built cases drive :class:`~foresight.cache.BudgetedCache` directly with synthetic keys and queries (one-hot
keys, queries that pick out a key), so the attention is known and the kept positions can be checked exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import foresight
from foresight.cache import BudgetedCache
from foresight.policies import POLICIES, make_policy, policy_names
from foresight.policies._common import pool1d
from foresight.schedule import CacheConfig, replay_schedule
from tests.conftest import TINY, get_model

B, W = 16, 8
#: hyperparameters the tiny end-to-end runs need (paged: P must divide W)
TEST_KWARGS = {"paged": {"block_size": 4}}
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "policies"


def _constructible() -> list[str]:
    names = []
    for name in policy_names():
        if POLICIES[name].replay_only:
            continue
        try:
            make_policy(name, **TEST_KWARGS.get(name, {}))
        except Exception:
            continue  # needs constructor arguments we cannot supply here (e.g. `learned` needs a scorer)
        names.append(name)
    return names


RUNNABLE = _constructible()
HEURISTICS = ["h2o", "tova", "snapkv", "rkv", "keydiff", "lazy", "paged", "caote"]


def _policy(name: str):
    return make_policy(name, **TEST_KWARGS.get(name, {}))


class KeepRecorder:
    """Wrap a policy's on_evict to record every keep tensor (per layer, in call order)."""

    def __init__(self, policy):
        self.keeps: list[torch.Tensor] = []
        inner = policy.on_evict

        def on_evict(layer_idx, keep):
            self.keeps.append(keep.clone())
            inner(layer_idx, keep)

        policy.on_evict = on_evict


def test_every_heuristic_is_registered_and_runnable():
    assert set(HEURISTICS) <= set(RUNNABLE)


# ---------------------------------------------------------------------------------------------------------------
# End to end on the tiny models
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RUNNABLE)
@pytest.mark.parametrize("model_name", TINY)
def test_generate_within_budget(model_name, name):
    model, tok = get_model(model_name)
    policy = _policy(name)
    rec = KeepRecorder(policy)
    prompts = [[5, 17, 33, 8, 90], list(range(40, 51))]  # batch 2, different lengths (left padding)
    res = foresight.generate(model, tok, prompts, policy=policy, budget=B, interval=W, max_new_tokens=30,
                             stop_on_eos=False)
    assert all(len(t) == 30 for t in res.token_ids)
    if policy.evicts:
        assert max(res.stats["peak_entries"]) <= B + W
        assert res.stats["evictions"] > 0
        assert {k.shape[-1] for k in rec.keeps} == {B}  # every eviction returns the cache to B
        assert B <= res.stats["final_entries"] < B + W


@pytest.mark.parametrize("name", RUNNABLE)
@pytest.mark.parametrize("model_name", TINY)
def test_replay_chunked_equals_token_by_token(model_name, name):
    """Replay in pieces of W and of 1 token: same evictions, same losses, no NaN, within budget."""
    model, _ = get_model(model_name)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(5, 200, (46,), generator=g).tolist(), torch.randint(5, 200, (37,), generator=g).tolist()]
    runs = []
    for chunk in (None, 1):
        policy = _policy(name)
        rec = KeepRecorder(policy)
        res = foresight.replay(model, seqs, policy=policy, budget=B, interval=W, chunk=chunk)
        runs.append((res, rec))
    (a, ra), (b, rb) = runs
    for res, lens in ((a, [46, 37]), (b, [46, 37])):
        for row, n in enumerate(lens):
            assert not torch.isnan(res.ce[row, : n - 1]).any()
            assert not torch.isnan(res.entropy[row, : n - 1]).any()
    if POLICIES[name].evicts:
        assert max(a.stats["peak_entries"]) <= B + W
        assert len(ra.keeps) == len(rb.keeps) > 0
        for ka, kb in zip(ra.keeps, rb.keeps):
            assert torch.equal(ka, kb)
    torch.testing.assert_close(a.ce, b.ce, atol=1e-4, rtol=1e-4, equal_nan=True)


# ---------------------------------------------------------------------------------------------------------------
# Driving the cache with synthetic keys and queries
# ---------------------------------------------------------------------------------------------------------------

D = 64  # head dim; one-hot keys e_i for i < D
HKV, G = 2, 2


def onehot_keys(n: int, batch: int = 1) -> torch.Tensor:
    eye = torch.eye(D)[:n]  # (n, D)
    return eye[None, None].expand(batch, HKV, n, D).clone()


def look_at(targets: list[int | None], scale: float = 240.0) -> torch.Tensor:
    """Queries (1, Hq, N, D): query t attends (almost) only to key ``targets[t]`` (its own key when None)."""
    n = len(targets)
    q = torch.zeros(1, HKV * G, n, D)
    for t, tgt in enumerate(targets):
        q[:, :, t, t if tgt is None else tgt] = scale
    return q


def drive(policy, keys, queries, budget=B, interval=W, values=None, chunk=1, sinks=0):
    """Feed synthetic keys/queries through a one-layer BudgetedCache the way replay does; return the cache."""
    b, _, n, d = keys.shape
    values = torch.randn(b, HKV, n, d, generator=torch.Generator().manual_seed(0)) if values is None else values
    cache = BudgetedCache.from_shape(1, G, policy, CacheConfig(budget, interval, sinks))
    for start, end, fire in replay_schedule(n, budget, interval, chunk):
        pos = torch.arange(start, end)[None].expand(b, -1)
        cache.begin_step(pos, torch.ones(b, end - start, dtype=torch.bool))
        k, v = cache.update(keys[:, :, start:end], values[:, :, start:end], 0)
        cache.observe(0, queries[:, :, start:end], k, v, cache.attention_mask(0, end - start, k.dtype))
        events = cache.events
        cache.end_step()  # the cache fires the event itself, exactly where the schedule says
        assert cache.events == events + fire
    cache.flush_observations()  # as replay does when it finishes: held decode steps reach the policy
    return cache


def kept(cache, head: int = 0) -> set[int]:
    return set(cache.layers[0].positions[0, head].tolist())


def test_h2o_keeps_an_old_attention_spike_streaming_llm_drops_it():
    n = 40
    targets = [None] * n
    targets[12] = 9  # one query, long ago, pays (almost) all its attention to token 9
    keys, queries = onehot_keys(n), look_at(targets)
    h2o = drive(make_policy("h2o"), keys, queries)
    stream = drive(make_policy("streaming_llm", sinks=0), keys, queries)
    assert h2o.events > 0 and stream.events == h2o.events
    assert 9 in kept(h2o) and 9 in kept(h2o, head=1)
    assert 9 not in kept(stream)


def test_lazy_keeps_a_periodically_attended_token():
    n = 60
    targets = [None] * n
    for t in range(8, n, 5):
        targets[t] = 3  # token 3 recurs every 5 steps
    # entry="fresh": under the published rule (default) every token here is attended once, by its own query, so
    # all have mri = 1 and outrank token 3 (mri = 5); tests/policies/test_lazy.py covers both variants
    cache = drive(make_policy("lazy", entry="fresh"), onehot_keys(n), look_at(targets))
    assert cache.events >= 4
    assert 3 in kept(cache)
    stream = drive(make_policy("streaming_llm", sinks=0), onehot_keys(n), look_at(targets))
    assert 3 not in kept(stream)


def test_tova_keeps_what_the_current_query_attends_and_one_set_per_layer():
    n = B + W
    targets = [None] * n
    targets[-1] = 2  # the newest query before the event looks at token 2
    keys = onehot_keys(n)
    queries = look_at(targets)
    queries[:, 2:] += torch.randn(1, 2, n, D, generator=torch.Generator().manual_seed(3))  # heads disagree
    cache = drive(make_policy("tova"), keys, queries)
    assert cache.events == 1
    assert 2 in kept(cache)
    assert kept(cache, 0) == kept(cache, 1)


def test_snapkv_keeps_window_attention_and_pools_neighbours():
    n = B + W
    t5 = B - 2  # a late candidate: its unattended neighbours tie with the rest, and ties evict the newer first
    targets = [None] * n
    for t in range(n - 4, n):
        targets[t] = t5  # the last 4 queries (inside the window) look at token t5
    keys, queries = onehot_keys(n), look_at(targets)
    plain = drive(make_policy("snapkv", window=8, kernel=1), keys, queries)
    pooled = drive(make_policy("snapkv", window=8, kernel=3, pooling="max"), keys, queries)
    assert t5 in kept(plain) and t5 in kept(pooled)
    assert {t5 - 1, t5 + 1} <= kept(pooled)
    assert not {t5 - 1, t5 + 1} & kept(plain)


def test_snapkv_forgets_queries_outside_the_window():
    n = B + W
    targets = [None] * n
    t5 = B - 2  # a late candidate: unattended, it ties with the rest, and ties evict the newer first
    targets[n - 10] = t5  # 10 queries before the event: outside a window of 4, inside a window of 16
    keys, queries = onehot_keys(n), look_at(targets)
    assert t5 not in kept(drive(make_policy("snapkv", window=4, kernel=1), keys, queries))
    assert t5 in kept(drive(make_policy("snapkv", window=16, kernel=1), keys, queries))


@pytest.mark.parametrize("name", ["rkv", "keydiff"])
def test_duplicate_key_is_dropped(name):
    n = B + 1  # one token over budget: evict exactly one
    keys = onehot_keys(n)
    keys[:, :, 7] = keys[:, :, 4]  # token 7 duplicates token 4
    queries = torch.zeros(1, HKV * G, n, D)  # uniform attention over the visible keys
    # rkv: observe only the newest query, which sees every candidate equally, so importance does not discriminate
    policy = make_policy(name, kernel=1, window=1) if name == "rkv" else make_policy(name)
    cache = drive(policy, keys, queries, budget=B, interval=1)
    gone = set(range(n)) - kept(cache)
    assert len(gone) == 1 and gone <= {4, 7}


def test_rkv_redundancy_matches_reference():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 3, 10, 8, generator=g)
    valid = torch.ones(2, 3, 10, dtype=torch.bool)
    valid[1, :, :3] = False
    got = make_policy("rkv").redundancy(keys, valid)
    for b in range(2):
        for h in range(3):
            idx = [i for i in range(10) if valid[b, h, i]]
            k = torch.nn.functional.normalize(keys[b, h, idx], dim=-1)
            sim = k @ k.T
            sim.fill_diagonal_(0)
            ref = torch.softmax(sim.sum(-1) / (len(idx) - 1), dim=-1)
            torch.testing.assert_close(got[b, h, idx], ref)
            assert torch.all(got[b, h, [i for i in range(10) if i not in idx]] == 0)


def test_paged_select_drops_whole_lowest_blocks():
    policy = make_policy("paged", block_size=4)
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(2, 3, 32, generator=g)
    keep = policy.select(scores, 24, view=None)
    for b in range(2):
        for h in range(3):
            gone = sorted(set(range(32)) - set(keep[b, h].tolist()))
            blocks = {i // 4 for i in gone}
            assert len(gone) == 8 and all(set(range(4 * k, 4 * k + 4)) <= set(gone) for k in blocks)
            means = scores[b, h].view(8, 4).mean(-1)
            assert blocks == set(means.argsort()[:2].tolist())


def test_paged_select_padding_first_sinks_never_partial_count():
    policy = make_policy("paged", block_size=4)
    scores = torch.arange(12.0).flip(0)[None, None].clone()  # block means: 9.5, 5.5, 1.5
    scores[..., 0] = float("inf")  # sink in block 0
    scores[..., 5] = float("-inf")  # padding in block 1
    keep = policy.select(scores, 6, view=None)  # evict 6: padding first, then block 2 (lowest), then one more
    gone = set(range(12)) - set(keep[0, 0].tolist())
    assert 0 not in gone and 5 in gone and {8, 9, 10, 11} <= gone and len(gone) == 6
    assert gone - {5, 8, 9, 10, 11} == {7}  # the rest comes from block 1, its lowest token


def test_paged_evicts_whole_blocks_in_the_cache():
    n = 64
    keys = torch.randn(1, HKV, n, D, generator=torch.Generator().manual_seed(1))
    policy = make_policy("paged", block_size=4)
    rec = KeepRecorder(policy)
    cache = drive(policy, keys, torch.zeros(1, HKV * G, n, D))
    assert cache.events > 3
    for keep in rec.keeps:
        cand = keep[..., : B - W]  # kept candidates, indices into the B + W entries before the event
        gone = set(range(B)) - set(cand[0, 0].tolist())
        assert all({4 * (i // 4) + j for j in range(4)} <= gone for i in gone)


def test_caote_drops_the_value_that_equals_the_output():
    n = B + 1
    keys = onehot_keys(n)
    queries = torch.zeros(1, HKV * G, n, D)  # uniform attention over the cache
    values = torch.randn(1, HKV, n, D, generator=torch.Generator().manual_seed(0)) * 3
    # token 6 carries the mean of all values: its removal barely changes the output of the last query
    values[:, :, 6] = (values.sum(2) - values[:, :, 6]) / (n - 1)
    tova = drive(make_policy("caote:tova"), keys, queries, interval=1, values=values)
    gone = set(range(n)) - kept(tova)
    assert gone == {6}


def test_caote_inner_named_twice_must_agree():
    assert make_policy("caote:h2o", inner="h2o", inner_kwargs={"group_reduce": "max"}).config() == {
        "inner": "h2o", "inner_kwargs": {"group_reduce": "max"}}  # caote.yaml's inner: h2o, with caote:h2o
    with pytest.raises(ValueError, match="names its inner policy .*'h2o'.* inner='tova'"):
        make_policy("caote:h2o", inner="tova")


def test_caote_forwards_hooks_to_inner():
    n = 40
    policy = make_policy("caote:h2o")
    ref = make_policy("h2o")
    keys = onehot_keys(n)
    queries = look_at([None] * n)
    cache = drive(policy, keys, queries)
    drive(ref, keys, queries)
    acc = policy.inner.state.get(0, "acc")
    assert acc.shape[-1] == cache.length
    torch.testing.assert_close(acc, ref.state.get(0, "acc"))
    assert policy.observes and policy.config()["inner"] == "h2o"


# ---------------------------------------------------------------------------------------------------------------
# LazyEviction bookkeeping
# ---------------------------------------------------------------------------------------------------------------


# The naive per-step reference for both LazyEviction variants lives in tests/policies/test_lazy.py.


def test_lazy_chunked_state_equals_step_state():
    n = 40
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(1, HKV, n, D, generator=g)
    queries = torch.randn(1, HKV * G, n, D, generator=g) * 0.6
    a = make_policy("lazy", alpha=0.05)
    b = make_policy("lazy", alpha=0.05)
    ca, cb = drive(a, keys, queries, chunk=W), drive(b, keys, queries, chunk=1)
    assert torch.equal(ca.layers[0].positions, cb.layers[0].positions)
    for name in ("last", "mri"):
        assert torch.equal(a.state.get(0, name), b.state.get(0, name))


def test_lazy_state_is_per_batch_row():
    n = 40
    g = torch.Generator().manual_seed(4)
    keys = torch.randn(2, HKV, n, D, generator=g)
    queries = torch.randn(2, HKV * G, n, D, generator=g) * 0.6
    both = make_policy("lazy", alpha=0.05)
    drive(both, keys, queries)
    for row in range(2):
        single = make_policy("lazy", alpha=0.05)
        drive(single, keys[row : row + 1], queries[row : row + 1])
        for name in ("last", "mri"):
            assert torch.equal(both.state.get(0, name)[row : row + 1], single.state.get(0, name))


# ---------------------------------------------------------------------------------------------------------------
# Hyperparameters, configs, CLI
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("lazy", {"alpha": -1e-4}),
        ("lazy", {"alpha": 0.0}),
        ("lazy", {"eps": 0.0}),
        ("lazy", {"group_reduce": "median"}),
        ("h2o", {"group_reduce": "median"}),
        ("snapkv", {"kernel": 0}),
        ("snapkv", {"window": 0}),
        ("snapkv", {"pooling": "median"}),
        ("rkv", {"lam": 1.5}),
        ("rkv", {"lam": -0.1}),
        ("rkv", {"kernel": 0}),
        ("rkv", {"window": 0}),
        ("paged", {"block_size": 0}),
        ("caote", {"inner": "keydiff"}),
        ("caote", {"inner": "streaming_llm"}),
        ("caote", {"inner": "h2o", "inner_kwargs": {"group_reduce": "bad"}}),
        ("caote", {"inner": 3}),  # --policy-arg inner=3: an AttributeError (exit 1) before
        ("caote:h2o", {"inner": "tova"}),  # the name's inner policy silently replaced the argument's
        ("h2o", {"alpha": 1.0}),
    ],
)
def test_bad_hyperparameters_raise(name, kwargs):
    with pytest.raises(ValueError):
        make_policy(name, **kwargs)


def test_streaming_llm_sinks_must_fit_the_budget(tiny_llama):
    model, tok = tiny_llama
    make_policy("streaming_llm", sinks=12).check_cache(16, 4)
    # sinks past B - W made every candidate a sink: the oldest entries were kept, silently not StreamingLLM
    with pytest.raises(ValueError, match=r"sinks \(13\) must be at most budget - interval \(16 - 4 = 12\)"):
        foresight.generate(model, tok, ["hi"], policy="streaming_llm", policy_kwargs={"sinks": 13}, budget=16,
                           interval=4)


def test_paged_block_must_divide_interval(tiny_llama):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="must divide the interval"):
        foresight.generate(model, tok, ["hi"], policy=make_policy("paged", block_size=3), budget=16, interval=8)
    make_policy("paged", block_size=4).check_cache(16, 8)


def test_pool1d_matches_reference():
    x = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    for kernel in (1, 2, 3, 4, 5, 7):
        for mode in ("max", "avg"):
            got = pool1d(x, kernel, mode)
            left = (kernel - 1) // 2
            ref = torch.empty_like(x)
            for i in range(11):
                win = x[..., max(0, i - left) : min(11, i - left + kernel)]
                ref[..., i] = win.amax(-1) if mode == "max" else win.mean(-1)
            torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_policy_yaml_configs_are_the_defaults(path):
    kwargs = yaml.safe_load(path.read_text()) or {}
    assert make_policy(path.stem, **kwargs).config() == make_policy(path.stem).config()


def test_every_heuristic_has_a_yaml_config():
    assert {p.stem for p in CONFIGS.glob("*.yaml")} >= set(HEURISTICS)


def test_cli_lists_every_policy(capsys):
    import json

    from foresight.cli import main

    assert main(["policies", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == set(policy_names())


@pytest.mark.parametrize(
    "args",
    [
        ["--policy", "lazy", "--policy-arg", "alpha=2e-4"],
        ["--policy", "caote:tova"],
        ["--policy", "paged", "--policy-config", str(CONFIGS / "paged.yaml"), "--interval", "16", "--budget", "32"],
        ["--policy", "rkv", "--policy-config", str(CONFIGS / "rkv.yaml")],
    ],
)
def test_cli_generate_with_policy(capsys, args):
    import json

    from foresight.cli import main

    base = ["generate", "--model", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "60", "--json"]
    if "--budget" not in args:
        base += ["--budget", "16", "--interval", "8"]
    assert main(base + args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["evictions"] > 0


def test_cli_bad_policy_argument_is_an_error(capsys):
    from foresight.cli import main

    rc = main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--policy", "rkv", "--policy-arg", "lam=2",
               "--budget", "16", "--interval", "8"])
    assert rc == 2
    assert "lam" in capsys.readouterr().err
