"""Decode steps read nothing back from the device (foresight.generation): inside the decode loop ``.item()``,
``.tolist()``, ``.cpu()``, ``.numpy()`` and any branch or conversion on a tensor's value raise, except at the
designated reads (whether every row finished, every EOS_READ_EVERY steps; the cache's ``_end_event``, once per
eviction event, with the policy's ``end_event``; the result at the end). On CUDA, ``torch.cuda.set_sync_debug_mode("error")`` checks the same."""

from __future__ import annotations

import contextlib

import pytest
import torch

import foresight
import foresight.generation as generation
from foresight.cache import BudgetedCache
from foresight.policies import make_policy
from foresight.scorer import Scorer, ScorerConfig
from tests.conftest import get_model

B, W = 16, 4
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
POLICIES = {
    "full": {}, "h2o": {}, "streaming_llm": {}, "keydiff": {}, "tova": {}, "snapkv": {}, "random": {},
    "paged": {"block_size": 2}, "learned-topk": {"spread": 0.05}, "learned-sample": {"selection": "sample"},
    "learned-compiled": {"spread": 0.05, "compile": "aot_eager"},
}


class _Reads:
    """Tensor reads raise while ``armed``; ``allowed`` counts the reads made through a designated read point."""

    def __init__(self, monkeypatch):
        self.armed, self.allowed = False, {}
        for name in READS:
            original = getattr(torch.Tensor, name)

            def guarded(t, *a, _name=name, _original=original, **k):
                if self.armed:
                    raise AssertionError(f"Tensor.{_name} read a value back inside a decode step")
                return _original(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, guarded)

    @contextlib.contextmanager
    def disarmed(self, point: str):
        was, self.armed = self.armed, False
        self.allowed[point] = self.allowed.get(point, 0) + 1
        try:
            yield
        finally:
            self.armed = was

    def allow(self, owner, name: str, point: str, monkeypatch):
        """Make ``owner.name`` a designated read point."""
        fn = getattr(owner, name)

        def reading(*a, **k):
            with self.disarmed(point):
                return fn(*a, **k)

        monkeypatch.setattr(owner, name, reading)


def _policy(name: str, model):
    if name.startswith("learned"):
        cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W,
                           feature_set=("prekey", "value", "attn", "age"), hidden=8)
        return make_policy("learned", scorer=Scorer(cfg, seed=0), **POLICIES[name])
    return make_policy(name, **POLICIES[name])


def _generate_without_reads(monkeypatch, model, tok, policy, prompts, **kw):
    """``foresight.generate`` with reads armed from the end of the prefill to the result."""
    reads = _Reads(monkeypatch)
    forward = generation.forward_logits

    def forward_then_arm(*a, **k):
        out = forward(*a, **k)
        reads.armed = True  # after the prefill: every later forward is a decode step
        return out

    monkeypatch.setattr(generation, "forward_logits", forward_then_arm)
    reads.allow(generation, "_finished_rows", "eos", monkeypatch)
    reads.allow(BudgetedCache, "_end_event", "event", monkeypatch)
    result = generation._result

    def disarm_for_good(*a, **k):
        reads.armed = False
        return result(*a, **k)

    monkeypatch.setattr(generation, "_result", disarm_for_good)
    res = foresight.generate(model, tok, prompts, policy=policy, **kw)
    return res, reads.allowed


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("align", ["rows", "batch"])
def test_decode_steps_read_nothing_back(tiny_llama, monkeypatch, name, align):
    model, tok = tiny_llama
    policy = _policy(name, model)
    prompts = ["Hello there, general", "Hi"]  # two lengths: `batch` pads one row
    budget = None if name == "full" else B
    res, allowed = _generate_without_reads(monkeypatch, model, tok, policy, prompts, budget=budget,
                                           interval=W if budget else None, max_new_tokens=40, align=align,
                                           stop_on_eos=False, do_sample=name == "learned-sample", seed=0)
    monkeypatch.undo()
    assert all(len(t) == 40 for t in res.token_ids)
    if budget:
        assert res.stats["evictions"] > 0
        assert allowed.get("event", 0) >= res.stats["evictions"]  # the reads happened at the events, not between
    ref = foresight.generate(model, tok, prompts, policy=_policy(name, model), budget=budget,
                             interval=W if budget else None, max_new_tokens=40, align=align, stop_on_eos=False,
                             do_sample=name == "learned-sample", seed=0)
    assert res.token_ids == ref.token_ids


def test_eos_is_read_every_few_steps_and_the_result_is_as_if_read_every_step(tiny_llama, monkeypatch):
    model, tok = tiny_llama  # one padded batch: one decode loop (prompts of two lengths otherwise run as two)
    prompts = ["Hello there", "Hi"]
    ref = foresight.generate(model, tok, prompts, policy="h2o", budget=B, interval=W, max_new_tokens=60, align="batch",
                             do_sample=True, temperature=2.0, seed=5)
    monkeypatch.setattr(generation, "EOS_READ_EVERY", 1)
    every = foresight.generate(model, tok, prompts, policy="h2o", budget=B, interval=W, max_new_tokens=60, align="batch",
                               do_sample=True, temperature=2.0, seed=5)
    monkeypatch.undo()
    assert torch.equal(ref.sequences, every.sequences) and ref.token_ids == every.token_ids
    res, allowed = _generate_without_reads(monkeypatch, model, tok, make_policy("h2o"), prompts, budget=B,
                                           interval=W, max_new_tokens=60, align="batch", do_sample=True, temperature=2.0, seed=5)
    assert res.token_ids == ref.token_ids
    groups = res.stats.get("groups", 1)  # prompts of two lengths decode as two groups, each reading for itself
    assert 0 < allowed["eos"] <= groups * (60 // generation.EOS_READ_EVERY)


def test_the_guard_catches_a_read(tiny_llama, monkeypatch):
    """The check can fail: a policy that branches on a tensor inside a decode step is caught."""
    model, tok = tiny_llama
    policy = make_policy("h2o")
    observe_layers = policy.observe_layers

    def branching(view):
        if view.probs.sum() > 0:  # a read
            observe_layers(view)

    policy.observe_layers = branching
    policy.score = lambda view, _s=policy.score: _s(view) if bool(view.valid.any()) else None
    with pytest.raises(AssertionError, match=r"Tensor.__bool__ read a value back inside a decode step"):
        _generate_without_reads(monkeypatch, model, tok, policy, ["Hello"], budget=B, interval=W, max_new_tokens=30,
                                stop_on_eos=False)


@pytest.mark.cuda
def test_no_device_sync_in_decode_steps_on_cuda(monkeypatch):
    if not torch.cuda.is_available():
        pytest.fail("needs a CUDA device")
    model, tok = foresight.load_model("tiny-llama", device="cuda", dtype=torch.float32)
    forward = generation.forward_logits
    calls = []

    def forward_then_error(*a, **k):
        out = forward(*a, **k)
        if not calls:
            torch.cuda.set_sync_debug_mode("error")
        calls.append(1)
        return out

    result = generation._result

    def warn_again(*a, **k):
        torch.cuda.set_sync_debug_mode(0)
        return result(*a, **k)

    monkeypatch.setattr(generation, "forward_logits", forward_then_error)
    monkeypatch.setattr(generation, "_result", warn_again)
    try:
        end_event = BudgetedCache._end_event

        def read_at_the_event(cache):
            torch.cuda.set_sync_debug_mode(0)
            end_event(cache)
            torch.cuda.set_sync_debug_mode("error")

        monkeypatch.setattr(BudgetedCache, "_end_event", read_at_the_event)
        for name in ("full", "h2o", "learned-topk"):
            policy = _policy(name, model)
            calls.clear()
            res = foresight.generate(model, tok, ["Hello there", "Hi"], policy=policy,
                                     budget=None if name == "full" else B, interval=None if name == "full" else W,
                                     max_new_tokens=40, stop_on_eos=False)
            assert len(calls) == 40 and all(len(t) == 40 for t in res.token_ids)
    finally:
        torch.cuda.set_sync_debug_mode(0)
