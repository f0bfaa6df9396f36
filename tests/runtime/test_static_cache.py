"""The static-shape budgeted cache (foresight/static_cache.py): the same tokens and evictions as the eager budgeted
cache, under ``foresight.generate`` and ``model.generate``, compiled or not; one compilation for a thousand decode
steps; the policies it cannot take decode eagerly (or are refused) with their name."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import foresight
from foresight.cache import BudgetedCache
from foresight.errors import ForesightError
from foresight.policies import make_policy
from foresight.policies.tova import TOVAPolicy
from foresight.scorer import Scorer, ScorerConfig
from foresight.static_cache import StaticBudgetedCache
from foresight.static_step import StaticConfig
from tests.conftest import TINY, get_model

B, W = 16, 4
EAGER = StaticConfig(compile=False)  # the fixed-shape step, not compiled
COMPILED = StaticConfig(backend="eager")  # dynamo traces the step (fullgraph); the graph runs eagerly: fast on a CPU


def policy(name: str, model):
    if name == "learned":
        cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8,
                           feature_set=("key", "prekey", "value", "attn", "age", "recency"))
        return make_policy("learned", scorer=Scorer(cfg, seed=0))
    return make_policy(name)


def budget_of(name):
    return (None, None) if name == "full" else (B, W)


def prompts(model, rows=2, length=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (rows, length), generator=g).tolist()


@pytest.mark.parametrize("model_name", TINY)
@pytest.mark.parametrize("name", ["full", "streaming_llm", "h2o", "learned", "tova", "snapkv", "rkv", "caote"])
def test_generate_static_equals_eager(model_name, name):
    model, tok = get_model(model_name)
    budget, interval = budget_of(name)
    rows = prompts(model)
    runs = {}
    for label, static in [("eager cache", False), ("static step", EAGER), ("compiled step", COMPILED)]:
        runs[label] = foresight.generate(model, tok, rows, policy=policy(name, model), budget=budget,
                                         interval=interval, max_new_tokens=40, stop_on_eos=False, static=static)
    ref = runs["eager cache"]
    if name != "full":
        assert ref.stats["evictions"] >= 5  # the decode steps crossed many events
    for label, res in runs.items():
        assert torch.equal(res.sequences, ref.sequences), label
        assert res.stats == ref.stats, label


def _hf(model, ids, cache, n=40, mask_dtype=torch.long):
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=mask_dtype), past_key_values=cache,
                          do_sample=False, max_new_tokens=n, min_new_tokens=n)


@pytest.mark.parametrize("model_name", TINY)
@pytest.mark.parametrize("name", ["full", "streaming_llm", "h2o", "learned", "tova", "snapkv", "rkv", "caote"])
def test_model_generate_static_equals_eager_and_foresight_generate(model_name, name):
    model, tok = get_model(model_name)
    budget, interval = budget_of(name)
    rows = prompts(model, seed=1)
    ids = torch.tensor(rows)
    with torch.inference_mode():
        eager = BudgetedCache(model, policy(name, model), budget, interval)
        ref = _hf(model, ids, eager)
        caches = {label: StaticBudgetedCache(model, policy(name, model), budget, interval, max_cache_len=64,
                                             static=cfg) for label, cfg in [("static", EAGER), ("compiled", COMPILED)]}
        for label, cache in caches.items():
            out = _hf(model, ids, cache)
            assert torch.equal(out, ref), label
            assert cache.static_steps == 39  # every decode step but the prefill ran static
            cache.flush_observations()
            assert cache.stats() == eager.stats(), label
            for a, b in zip(cache.layers, eager.layers):  # the same entries kept, per KV head, in the same order
                assert torch.equal(a.positions, b.positions)
                # masked slots change the attention's float rounding, not its value
                torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-5)
    ours = foresight.generate(model, tok, rows, policy=policy(name, model), budget=budget, interval=interval,
                              max_new_tokens=40, stop_on_eos=False, static=COMPILED)
    assert torch.equal(ours.sequences, ref)


def test_float64_and_a_protected_prompt_with_sinks():
    model, tok = foresight.load_model("tiny-qwen3", device="cpu", dtype=torch.float64)
    rows = prompts(model, rows=3, length=9, seed=2)
    kw = dict(policy="h2o", budget=B, interval=W, sinks=2, protect_prompt=True, max_new_tokens=50, stop_on_eos=False)
    ref = foresight.generate(model, tok, rows, **kw)
    got = foresight.generate(model, tok, rows, static=COMPILED, **kw)
    assert ref.stats["evictions"] >= 5
    assert torch.equal(got.sequences, ref.sequences)


def test_padded_batch_decodes_static_for_a_policy_that_observes_nothing(capsys):
    model, tok = get_model("tiny-llama")
    rows = [prompts(model, 1, 5, 3)[0], prompts(model, 1, 13, 4)[0]]
    kw = dict(budget=B, interval=W, max_new_tokens=40, stop_on_eos=False, align="batch")
    for name in ("streaming_llm", "h2o"):
        ref = foresight.generate(model, tok, rows, policy=name, **kw)
        got = foresight.generate(model, tok, rows, policy=name, static=COMPILED, **kw)
        assert torch.equal(got.sequences, ref.sequences), name
    err = capsys.readouterr().err
    assert "policy 'h2o' observes decode steps and the batch is left-padded" in err  # h2o: eager, with the reason
    assert "streaming_llm" not in err


def test_a_thousand_decode_steps_compile_once():
    """Zero recompiles: dynamo compiles the step once for 1,000 decode steps, across every eviction event."""
    torch._dynamo.reset()
    model, tok = get_model("tiny-llama")
    for name, budget, interval in [("h2o", B, W), ("full", None, None)]:
        counter = CompileCounter()
        with torch.inference_mode():
            cache = StaticBudgetedCache(model, name, budget, interval, max_cache_len=1010,
                                        static=StaticConfig(backend=counter))
            # a boolean mask: each step's validity is a view of the growing mask, its strides change every step
            _hf(model, torch.tensor(prompts(model, rows=2, length=8, seed=5)), cache, n=1000, mask_dtype=torch.bool)
        assert cache.static_steps == 999
        assert counter.frame_count == 1, name
        if name == "h2o":
            assert cache.stats()["evictions"] >= 240


def test_continuing_a_sequence_leaves_and_reenters_the_static_steps():
    model, _ = get_model("tiny-qwen3")
    ids = torch.tensor(prompts(model, seed=6))
    with torch.inference_mode():
        outs = []
        for cache in (BudgetedCache(model, "h2o", B, W), StaticBudgetedCache(model, "h2o", B, W, static=COMPILED)):
            first = _hf(model, ids, cache, n=20)
            more = torch.cat([first, torch.tensor(prompts(model, length=6, seed=7))], dim=1)  # six tokens at once
            outs.append(_hf(model, more, cache, n=20))
        assert torch.equal(outs[0], outs[1])
        assert cache.static_steps == 38


@dataclass
class PerStepTova(TOVAPolicy):
    """tova observing its decode steps one layer at a time, as a plugin policy that does not set observes_layers."""

    name = "per_step_tova"
    observes_layers = False


def test_unsupported_policies_are_named():
    model, tok = get_model("tiny-llama")
    with pytest.raises(ValueError, match="policy 'per_step_tova' observes every decode step layer by layer"):
        StaticBudgetedCache(model, PerStepTova(), B, W)
    with pytest.raises(ValueError, match="policy 'full' never evicts, so the cache needs max_cache_len"):
        StaticBudgetedCache(model, "full")
    with pytest.raises(ValueError, match="backend"):
        StaticConfig(backend="")


def test_an_unsupported_policy_decodes_eagerly_with_the_reason(capsys):
    model, tok = get_model("tiny-llama")
    rows = prompts(model, seed=8)
    ref = foresight.generate(model, tok, rows, policy="tova", budget=B, interval=W, max_new_tokens=12)
    got = foresight.generate(model, tok, rows, policy=PerStepTova(), budget=B, interval=W, max_new_tokens=12,
                             static=COMPILED)
    assert torch.equal(got.sequences, ref.sequences)
    assert "decoding on the eager cache (not compiled): policy 'per_step_tova'" in capsys.readouterr().err


def test_a_full_static_cache_refuses_to_overflow():
    model, _ = get_model("tiny-llama")
    with torch.inference_mode(), pytest.raises(ForesightError, match="all 16 slots are used"):
        _hf(model, torch.tensor(prompts(model, rows=1, length=8)), StaticBudgetedCache(
            model, "full", max_cache_len=16, static=COMPILED), n=20)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["h2o", "learned"])
def test_inductor_compiled_step_equals_eager(name):
    model, tok = get_model("tiny-llama")
    rows = prompts(model, seed=9)
    kw = dict(policy=None, budget=B, interval=W, max_new_tokens=40, stop_on_eos=False)
    ref = foresight.generate(model, tok, rows, **{**kw, "policy": policy(name, model)})
    got = foresight.generate(model, tok, rows, static=StaticConfig(), **{**kw, "policy": policy(name, model)})
    assert torch.equal(got.sequences, ref.sequences)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["full", "h2o", "learned"])
def test_cuda_graphs_step_equals_eager_on_gpu(name):
    """On a GPU the step is compiled with mode reduce-overhead (CUDA graphs); the tokens are the eager cache's."""
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device: `make test-cuda` checks the runtime on a GPU")
    model, tok = foresight.load_model("tiny-llama", device="cuda", dtype=torch.float32)
    rows = prompts(model, seed=10)
    budget, interval = budget_of(name)
    kw = dict(budget=budget, interval=interval, max_new_tokens=60, stop_on_eos=False)
    ref = foresight.generate(model, tok, rows, policy=policy(name, model), **kw)
    got = foresight.generate(model, tok, rows, policy=policy(name, model), static=True, **kw)
    assert torch.equal(got.sequences, ref.sequences)


@pytest.mark.slow  # inductor compiles the step on the CPU (about 25 s on two cores)
def test_bench_compile_both_measures_each_policy_both_ways(tmp_path, capsys):
    from foresight.cli import main

    out = tmp_path / "bench"
    assert main(["bench", "--model", "tiny-llama", "--policies", "h2o", "--budget", "16", "--interval", "4",
                 "--new-tokens", "24", "--repeats", "1", "--prompt", "hello", "--compile", "both",
                 "--out", str(out)]) == 0
    import json

    data = json.loads((out / "bench.json").read_text())
    recs = {r["policy"]: r for r in data["records"]}
    assert set(recs) == {"full", "h2o", "full compiled", "h2o compiled"}
    assert [recs[n]["compiled"] for n in ("full", "h2o", "full compiled", "h2o compiled")] == [False, False, True, True]
    assert recs["h2o compiled"]["evictions"] == recs["h2o"]["evictions"] > 0
    assert data["settings"]["compile"] == "both"


def test_bench_compile_refuses_a_policy_it_cannot_take():
    from evaluation.efficiency import refuse_uncompilable

    refuse_uncompilable([make_policy(name) for name in ("h2o", "tova", "snapkv", "rkv", "caote")], "yes", B)
    with pytest.raises(ForesightError, match="--compile yes: policy 'per_step_tova' observes every decode step layer"):
        refuse_uncompilable([make_policy("h2o"), PerStepTova()], "yes", B)
    refuse_uncompilable([PerStepTova()], "no", B)  # the eager cache takes any policy


@pytest.mark.parametrize("name", ["h2o", "learned-topk", "streaming_llm"])
@pytest.mark.parametrize("cfg", [EAGER, COMPILED], ids=["static", "compiled"])
def test_static_decode_steps_read_nothing_back(monkeypatch, name, cfg):
    """The static path keeps the decode loop's contract (tests/test_sync_free.py): no read inside a decode step."""
    from tests.runtime.test_sync_free import _generate_without_reads, _policy

    model, tok = get_model("tiny-llama")
    kw = dict(budget=B, interval=W, max_new_tokens=30, stop_on_eos=False)
    ref = foresight.generate(model, tok, prompts(model, seed=11), policy=_policy(name, model), **kw)
    res, allowed = _generate_without_reads(monkeypatch, model, tok, _policy(name, model), prompts(model, seed=11),
                                           static=cfg, **kw)
    assert torch.equal(res.sequences, ref.sequences)
    assert allowed.get("event", 0) == res.stats["evictions"] > 0


@pytest.mark.parametrize("name, kwargs", [("lazy", {}), ("keydiff", {}), ("random", {}), ("paged", {"block_size": 2})])
def test_other_policies_it_takes_keep_their_tokens(name, kwargs):
    model, tok = get_model("tiny-qwen3")
    rows = prompts(model, seed=12)
    kw = dict(budget=B, interval=W, max_new_tokens=40, stop_on_eos=False)
    ref = foresight.generate(model, tok, rows, policy=make_policy(name, **kwargs), **kw)
    got = foresight.generate(model, tok, rows, policy=make_policy(name, **kwargs), static=COMPILED, **kw)
    assert ref.stats["evictions"] >= 5
    assert torch.equal(got.sequences, ref.sequences) and got.stats == ref.stats


def test_a_deep_copy_of_the_model_runs_its_own_weights():
    """copy.deepcopy of a model the static cache has served (its forward wrapped, a step compiled for it) runs the
    copy's weights, eagerly and through the compiled step, not the original's."""
    import copy

    model, tok = get_model("tiny-llama")
    rows = prompts(model)
    foresight.generate(model, tok, rows, policy=policy("h2o", model), budget=B, interval=W, max_new_tokens=12,
                       stop_on_eos=False, static=COMPILED)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.5)
    ids = torch.tensor(rows)
    with torch.no_grad():
        want = type(twin).forward(twin, input_ids=ids).logits
        torch.testing.assert_close(twin(input_ids=ids).logits, want)
        assert not torch.allclose(model(input_ids=ids).logits, want)
    kw = dict(policy="h2o", budget=B, interval=W, max_new_tokens=30, stop_on_eos=False)
    eager = foresight.generate(twin, tok, rows, **kw)
    compiled = foresight.generate(twin, tok, rows, static=COMPILED, **kw)
    assert torch.equal(compiled.sequences, eager.sequences)
    assert not torch.equal(compiled.sequences, foresight.generate(model, tok, rows, static=COMPILED, **kw).sequences)
