"""``BudgetedCache`` with a PEFT model (it finds the transformers model inside), and a used cache passed again to
``generate`` (it continues the sequence it has seen; the same prompt again is refused in one line)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

import foresight
from foresight.errors import ForesightError
from foresight.models import base_model_of
from foresight.tiny_models import build_tiny_model

B, W = 12, 4


def _generate(model, tok, cache, prompt="the cache keeps", n=40, ids=None):
    inputs = tok([prompt], return_tensors="pt") if ids is None else {"input_ids": ids,
                                                                       "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        return model.generate(**inputs, past_key_values=cache, max_new_tokens=n, do_sample=False,
                              pad_token_id=tok.pad_token_id)


def test_a_peft_model_generates_under_the_budget_as_its_base_model():
    base, tok = build_tiny_model("tiny-llama")
    reference = _generate(base, tok, foresight.BudgetedCache(base, "h2o", budget=B, interval=W))
    peft = get_peft_model(build_tiny_model("tiny-llama")[0], LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert base_model_of(peft) is peft.get_base_model()
    cache = foresight.BudgetedCache(peft, "h2o", budget=B, interval=W)
    out = _generate(peft, tok, cache)  # LoRA B starts at zero: the same model as the base
    assert torch.equal(out, reference) and cache.stats()["evictions"] >= 1
    assert max(cache.stats()["peak_entries"]) <= B + W
    # its fingerprint is its base model's (the adapter's weights are the "adapter" entry's business)
    assert foresight.model_fingerprint(peft)["weights"] == foresight.model_fingerprint(base)["weights"]


def test_a_used_cache_continues_its_sequence_and_refuses_the_same_prompt_again():
    model, tok = build_tiny_model("tiny-llama")
    cache = foresight.BudgetedCache(model, "h2o", budget=B, interval=W)
    first = _generate(model, tok, cache)
    seen = cache.fed
    with pytest.raises(ForesightError) as err:
        _generate(model, tok, cache)
    assert "\n" not in str(err.value) and f"already seen {seen} tokens" in str(err.value)
    more = torch.cat([first, tok(" and more", return_tensors="pt")["input_ids"]], dim=1)
    second = _generate(model, tok, cache, ids=more, n=10)
    assert torch.equal(second[:, :more.shape[1]], more) and second.shape[1] > more.shape[1]
    assert cache.fed == second.shape[1] - 1 and max(cache.stats()["peak_entries"]) <= B + W
