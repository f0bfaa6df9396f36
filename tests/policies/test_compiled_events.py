"""The ``learned`` policy's compiled events (``compile=...``): the same evictions and CE as its eager events, in both
replay engines and in decoding, and no recompilation from one event to the next."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import foresight
from foresight.errors import ForesightError
from foresight.policies import make_policy
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model

B, W = 16, 4
FEATURES = ("prekey", "value", "attn", "age", "recency", "neighbors", "query")


def _scorer(model) -> Scorer:
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, feature_set=FEATURES, hidden=8)
    return Scorer(cfg, seed=1)


def _seqs(lengths=(90, 61), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]


def _replay(model, policy, seqs, engine):
    """The replay and the kept indices of every layer-event, in order."""
    kept = []
    on_evict, on_evict_layers = policy.on_evict, policy.on_evict_layers
    policy.on_evict = lambda layer, keep: (kept.append(keep.clone()), on_evict(layer, keep))[1]
    policy.on_evict_layers = lambda layers, keep: (kept.extend(keep.clone()), on_evict_layers(layers, keep))[1]
    return foresight.replay(model, seqs, policy, B, W, engine=engine), kept


ARGS = dict(spread=0.05, age_prior=0.05, newcomer_bonus=0.1, any_budget=True)
SAMPLED = dict(selection="sample", temperature=0.5, seed=3, any_budget=True)


@pytest.mark.parametrize("engine", ["layer-major", "piecewise"])
@pytest.mark.parametrize("args", [ARGS, SAMPLED], ids=["topk", "sample"])
def test_compiled_events_evict_as_eager_ones(engine, args):
    """aot_eager: dynamo's graphs run by eager kernels, so compiled and eager events are bitwise alike (under
    sampling the draw itself stays eager, from the layer's generator)."""
    torch._dynamo.reset()
    model, _ = get_model("tiny-qwen3")
    sc = _scorer(model)
    ref, ref_kept = _replay(model, make_policy("learned", scorer=sc, **args), _seqs(), engine)
    got, got_kept = _replay(model, make_policy("learned", scorer=sc, compile="aot_eager", **args), _seqs(), engine)
    assert got.engine == engine and ref.stats == got.stats and ref.stats["evictions"] > 0
    assert len(ref_kept) == len(got_kept) > 0
    assert all(torch.equal(a, b) for a, b in zip(ref_kept, got_kept))
    torch.testing.assert_close(got.ce, ref.ce, rtol=0, atol=0, equal_nan=True)


@pytest.mark.slow
def test_inductor_events_evict_as_eager_ones():
    """The default backend (inductor: generated C++): the same evictions, CE within float rounding."""
    torch._dynamo.reset()
    model, _ = get_model("tiny-llama")
    sc = _scorer(model)
    ref, ref_kept = _replay(model, make_policy("learned", scorer=sc, **ARGS), _seqs(), "layer-major")
    got, got_kept = _replay(model, make_policy("learned", scorer=sc, compile=True, **ARGS), _seqs(), "layer-major")
    assert ref.stats == got.stats and all(torch.equal(a, b) for a, b in zip(ref_kept, got_kept))
    torch.testing.assert_close(got.ce, ref.ce, rtol=0, atol=1e-5, equal_nan=True)


def test_events_compile_once_per_state_not_per_event():
    """The ring's query counter is read outside the compiled event: its graphs are one per fill of the ring (and
    the first event, with nothing folded yet), however many events follow; a longer replay adds none."""
    torch._dynamo.reset()
    model, _ = get_model("tiny-llama")
    counter = CompileCounter()
    policy = make_policy("learned", scorer=_scorer(model), compile=counter, **ARGS)
    out = foresight.replay(model, _seqs((120,)), policy, B, W, engine="layer-major")
    frames = counter.frame_count
    # ring fills 20, 24, 28, 32 of R = 32 rows, the first event (each one graph, scores to kept entries)
    assert out.stats["evictions"] > 20 and 2 <= frames <= 8
    again = foresight.replay(model, _seqs((300,), seed=1), policy, B, W, engine="layer-major")
    assert again.stats["evictions"] > 60 and counter.frame_count == frames, frames


def test_a_layer_event_is_one_compiled_call_unless_a_subclass_selects_otherwise():
    """Under ``topk`` a layer's event, from its features to the entries it keeps, is one compiled graph; a subclass
    that overrides the selection (DAgger's mixture) scores in one and selects in another (the spread's), and
    both keep what the eager events keep."""
    from foresight.policies.learned import LearnedPolicy

    class Mine(LearnedPolicy):
        def select(self, scores, num_keep, view):
            return super().select(scores, num_keep, view)

    model, _ = get_model("tiny-llama")
    sc = _scorer(model)
    _, ref_kept = _replay(model, make_policy("learned", scorer=sc, **ARGS), _seqs((90,)), "layer-major")
    frames = []
    for policy in (make_policy, lambda name, **kw: Mine(**kw)):
        torch._dynamo.reset()
        counter = CompileCounter()
        _, kept = _replay(model, policy("learned", scorer=sc, compile=counter, **ARGS), _seqs((90,)), "layer-major")
        assert len(kept) == len(ref_kept) > 0 and all(torch.equal(a, b) for a, b in zip(ref_kept, kept))
        frames.append(counter.frame_count)
    assert frames[1] == frames[0] + 1, frames  # the subclass's spread, compiled on its own
    torch._dynamo.reset()


def test_compiled_events_decode_as_eager_ones():
    """Decoding scores every layer of an event at once: that path compiles too, and generates the same tokens."""
    torch._dynamo.reset()
    model, tok = get_model("tiny-qwen3")
    sc = _scorer(model)
    prompts = [[5, 17, 33, 9, 41, 7]]
    ref = foresight.generate(model, tok, prompts, policy=make_policy("learned", scorer=sc, **ARGS), budget=B,
                             interval=W, max_new_tokens=40, do_sample=False)
    counter = CompileCounter()
    pol = make_policy("learned", scorer=sc, compile=counter, **ARGS)
    got = foresight.generate(model, tok, prompts, policy=pol, budget=B, interval=W, max_new_tokens=40,
                             do_sample=False)
    assert counter.frame_count > 0 and torch.equal(got.sequences, ref.sequences)


@pytest.mark.parametrize("bad", [3, "", 0.5])
def test_compile_takes_a_switch_or_a_backend(bad):
    model, _ = get_model("tiny-llama")
    with pytest.raises((ValueError, ForesightError), match="compile must be"):
        make_policy("learned", scorer=_scorer(model), compile=bad)


def test_an_unknown_backend_is_refused_naming_it():
    model, _ = get_model("tiny-llama")
    with pytest.raises(ValueError,
                       match="compile='nosuch' is not a torch.compile backend; use true or one of .*inductor"):
        make_policy("learned", scorer=_scorer(model), compile="nosuch")


def test_the_relaxed_policy_refuses_compile():
    from training.e2e_policy import RelaxedLearnedPolicy

    model, _ = get_model("tiny-llama")
    with pytest.raises(ValueError, match="drop compile"):
        RelaxedLearnedPolicy(scorer=_scorer(model), compile=True)


def test_inductor_without_a_cpp_compiler_is_refused_before_any_work(monkeypatch):
    import foresight.policies.learned as learned

    model, _ = get_model("tiny-llama")
    monkeypatch.setattr(learned.shutil, "which", lambda name: None)
    with pytest.raises(ForesightError, match="compile=True: inductor on the CPU builds C\\+\\+ and no compiler"):
        make_policy("learned", scorer=_scorer(model), compile=True)
    make_policy("learned", scorer=_scorer(model), compile="aot_eager")  # builds no C++


def test_past_the_recompile_limit_events_run_eagerly_rather_than_fail():
    """A long job meets many batch shapes: once dynamo's limit is spent, a new shape's events run eagerly (the same
    evictions), and the job goes on."""
    torch._dynamo.reset()
    model, _ = get_model("tiny-llama")
    sc = _scorer(model)
    counter = CompileCounter()
    policy = make_policy("learned", scorer=sc, compile=counter, **ARGS)
    with torch._dynamo.config.patch(recompile_limit=1):
        for lengths in [(90,), (90, 61), (70, 64, 50)]:  # three batch shapes
            got, got_kept = _replay(model, policy, _seqs(lengths), "layer-major")
            ref, ref_kept = _replay(model, make_policy("learned", scorer=sc, **ARGS), _seqs(lengths), "layer-major")
            assert all(torch.equal(a, b) for a, b in zip(ref_kept, got_kept)) and len(got_kept) == len(ref_kept)
    assert counter.frame_count == 1  # the first shape's first event (scores to kept entries, one graph); the limit
    torch._dynamo.reset()
