"""The runtime on a GPU against the same computation on the CPU (``make test-cuda``; deselected by default).

Everything else in the suite runs on the CPU. These tests put the tiny random models (fp32, TF32 off) on CUDA and
check that each piece the project's numbers rest on gives there what it gives on the CPU: greedy decoding with the
full cache equals HF ``generate``; chunked replay under every policy (the learned one included) gives the same
per-token losses and the same number of evictions; budgeted generation keeps the same tokens (decode steps held
until the event and observed as one chunk); ``model.generate`` with a :class:`BudgetedCache` equals
``foresight.generate``; the golden oracle picks the same evict sets with the same foresight values; the scorer's
features are the same, the pre-RoPE keys included; the KL loss of ``train adapt`` and its LoRA gradients through the
budgeted replay are the same. In bf16 (what CUDA loads models in by default) every policy keeps the budget and yields
finite losses. Without a CUDA device the module fails at once instead of passing vacuously.
"""

from __future__ import annotations

import pytest
import torch

import foresight
from foresight.features import FeatureExtractor
from foresight.policies import make_policy, policy_names
from foresight.policies.recorder import FeatureRecorder
from foresight.scorer import Scorer, ScorerConfig
from golden.oracle import label_trace
from tests.conftest import TINY, get_model, seeded_lora
from training.adapt_student import EvictedStudent, distillation_loss

pytestmark = pytest.mark.cuda

B, W = 16, 4
FEATURES = ("key", "prekey", "value", "attn", "age", "recency")  # prekey: RoPE undone on the device
#: Decode-time policies (``golden`` only replays labelled traces; ``full`` is tested against HF generate).
POLICIES = [p for p in policy_names() if p not in ("full", "golden")]
KWARGS = {"paged": {"block_size": W}}  # paged frees whole blocks: its block must divide W
PROMPTS = ["Hello world, this is a longer test prompt.", "Hi", "What is 2+2? Think."]


@pytest.fixture(scope="module", autouse=True)
def cuda_fp32():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device: `make test-cuda` checks the runtime on a GPU (the default suite is CPU-only)")
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # compare fp32 with fp32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


_GPU: dict[str, tuple] = {}


def pair(name: str):
    """(cpu model, cuda model, tokenizer): the same seeded tiny model on both devices."""
    cpu, tok = get_model(name)
    if name not in _GPU:
        _GPU[name] = foresight.load_model(name, device="cuda")
    return cpu, _GPU[name][0], tok


def scorer_for(model, seed: int = 0) -> Scorer:
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, feature_set=FEATURES, hidden=8)
    return Scorer(cfg, seed=seed)


def policy(name: str, model):
    return make_policy(name, scorer=scorer_for(model)) if name == "learned" else make_policy(name, **KWARGS.get(name, {}))


def ids(n: int = 2, length: int = 110, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 250, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("batch", [1, 3])
def test_full_policy_matches_hf_generate_on_cuda(name, batch):
    _, gpu, tok = pair(name)
    enc = tok(PROMPTS[:batch], return_tensors="pt", padding=True).to("cuda")
    ref = gpu.generate(**enc, do_sample=False, max_new_tokens=40)
    ours = foresight.generate(gpu, tok, PROMPTS[:batch], policy="full", max_new_tokens=40)
    assert ours.sequences.device.type == "cuda"
    assert torch.equal(ours.sequences, ref)


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("pol", POLICIES)
def test_replay_on_cuda_equals_cpu(name, pol):
    cpu, gpu, _ = pair(name)
    seq = ids()
    a = foresight.replay(cpu, seq, policy=policy(pol, cpu), budget=B, interval=W)
    b = foresight.replay(gpu, seq.cuda(), policy=policy(pol, gpu), budget=B, interval=W)
    assert a.stats["evictions"] == b.stats["evictions"] > 0
    torch.testing.assert_close(b.ce.cpu(), a.ce, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("pol", ["streaming_llm", "h2o", "tova", "lazy", "learned"])
def test_budgeted_generation_on_cuda_equals_cpu(name, pol):
    """Greedy decoding under eviction, decode steps held until the event (observed there as one chunk)."""
    cpu, gpu, tok = pair(name)
    kw = dict(budget=B, interval=W, max_new_tokens=80, stop_on_eos=False)
    a = foresight.generate(cpu, tok, PROMPTS, policy=policy(pol, cpu), **kw)
    b = foresight.generate(gpu, tok, PROMPTS, policy=policy(pol, gpu), **kw)
    assert a.stats["evictions"] == b.stats["evictions"] > 0
    assert a.stats["peak_entries"] == b.stats["peak_entries"]
    assert b.token_ids == a.token_ids


@pytest.mark.parametrize("name", TINY)
def test_compiled_learned_events_on_cuda_equal_eager_cpu(name):
    """``learned`` with its events compiled by inductor (Triton on the GPU): the CPU's eager evictions and tokens, in
    a layer-major replay and in decoding (every layer of an event scored at once)."""
    cpu, gpu, tok = pair(name)
    sc = scorer_for(cpu)
    eager = make_policy("learned", scorer=sc, spread=0.05)
    compiled = make_policy("learned", scorer=scorer_for(gpu), spread=0.05, compile=True)
    seq = ids()
    a = foresight.replay(cpu, seq, policy=eager, budget=B, interval=W)
    b = foresight.replay(gpu, seq.cuda(), policy=compiled, budget=B, interval=W)
    assert b.engine == "layer-major" and a.stats["evictions"] == b.stats["evictions"] > 0
    torch.testing.assert_close(b.ce.cpu(), a.ce, atol=2e-4, rtol=2e-4)
    kw = dict(budget=B, interval=W, max_new_tokens=80, stop_on_eos=False)
    ref = foresight.generate(cpu, tok, PROMPTS, policy=make_policy("learned", scorer=sc, spread=0.05), **kw)
    got = foresight.generate(gpu, tok, PROMPTS, policy=make_policy("learned", scorer=scorer_for(gpu), spread=0.05,
                                                                   compile=True), **kw)
    assert got.token_ids == ref.token_ids


@pytest.mark.parametrize("pol", ["h2o", "learned"])
def test_hf_generate_with_budgeted_cache_on_cuda(pol):
    _, gpu, tok = pair("tiny-llama")
    prompt = PROMPTS[0]
    ours = foresight.generate(gpu, tok, [prompt], policy=policy(pol, gpu), budget=B, interval=W,
                              max_new_tokens=60, stop_on_eos=False)
    cache = foresight.BudgetedCache(gpu, policy=policy(pol, gpu), budget=B, interval=W)
    enc = tok([prompt], return_tensors="pt").to("cuda")
    out = gpu.generate(**enc, past_key_values=cache, do_sample=False, max_new_tokens=60, min_new_tokens=60)
    assert out[0, enc["input_ids"].shape[1]:].tolist() == ours.token_ids[0]


@pytest.mark.parametrize("name", TINY)
def test_golden_labels_on_cuda_equal_cpu(name):
    cpu, gpu, _ = pair(name)
    seq = ids(1, 96, seed=4)
    a = label_trace(cpu, seq, B, W)
    b = label_trace(gpu, seq.cuda(), B, W)
    assert len(a.events) == len(b.events) > 0
    for ea, eb in zip(a.events, b.events):
        assert ea.end == eb.end
        assert torch.equal(eb.candidates.cpu(), ea.candidates) and torch.equal(eb.evicted.cpu(), ea.evicted)
        torch.testing.assert_close(eb.alpha.cpu(), ea.alpha, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(b.foresight.cpu(), a.foresight, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", TINY)
def test_scorer_features_on_cuda_equal_cpu(name):
    cpu, gpu, _ = pair(name)
    seq = ids(2, 70, seed=5)
    got = {}
    for dev, model in (("cpu", cpu), ("cuda", gpu)):
        rows = got[dev] = []
        rec = FeatureRecorder(extractor=FeatureExtractor(window=W, feature_set=FEATURES),
                              driver=make_policy("h2o"), on_event=lambda view, f, rows=rows: rows.append(f.cpu()))
        foresight.replay(model, seq.to(dev), rec, B, W)
    assert len(got["cpu"]) == len(got["cuda"]) > 0
    for fa, fb in zip(got["cpu"], got["cuda"]):
        torch.testing.assert_close(fb, fa, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pol", POLICIES)
def test_bf16_on_cuda_keeps_the_budget_and_finite_losses(pol):
    model, tok = foresight.load_model("tiny-qwen3", device="cuda")
    model = model.to(torch.bfloat16)
    res = foresight.generate(model, tok, PROMPTS, policy=policy(pol, model), budget=B, interval=W,
                             max_new_tokens=120, stop_on_eos=False)
    assert res.stats["evictions"] > 0 and res.stats["final_entries"] <= B + W
    rep = foresight.replay(model, ids().cuda(), policy=policy(pol, model), budget=B, interval=W)
    assert torch.isfinite(rep.ce).all()


@pytest.mark.parametrize("pol", ["h2o", "learned"])
def test_adapt_kl_and_lora_gradients_on_cuda_equal_cpu(pol):
    """`train adapt`'s loss: KL(full-cache teacher with the adapter off || student replayed under eviction), with
    gradients through the budgeted replay, on both devices from the same seeded LoRA (non-zero B)."""
    seq = ids(1, 64, seed=6)[0].tolist()
    got = {}
    for dev in ("cpu", "cuda"):
        model, _ = foresight.load_model("tiny-llama", device="cpu")  # LoRA initialised on the CPU for both: the CUDA
        peft_model = seeded_lora(model, seed=0).to(dev)               # generator draws other numbers from one seed
        assert model.device.type == dev
        student = EvictedStudent(peft_model, policy(pol, model), B, W)
        loss, metrics = distillation_loss(student, peft_model, student.lm, [seq], B, W)
        loss.backward()
        got[dev] = (loss.item(), metrics, {n: p.grad.detach().cpu() for n, p in student.lora.items()})
    (la, ma, ga), (lb, mb, gb) = got["cpu"], got["cuda"]
    assert ma["positions"] == mb["positions"] == len(seq) - 1 - (B + W)
    assert lb == pytest.approx(la, rel=1e-4, abs=1e-6) and la > 0
    assert ga.keys() == gb.keys()
    for name in ga:
        assert ga[name].abs().sum() > 0, name
        torch.testing.assert_close(gb[name], ga[name], atol=1e-4, rtol=1e-3)
