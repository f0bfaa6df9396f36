"""Bring your own model (docs/models.md), on SmolLM2-135M-Instruct: the quickstart shows a completion and its
evictions, and the model loaded through transformers from a saved copy runs the shipped scorer with the same tokens
as ``foresight.load_model``."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import foresight

REPO = Path(__file__).resolve().parents[2]


def _quickstart() -> str:
    text = (REPO / "docs" / "models.md").read_text()
    block = re.search(r"<!-- quickstart[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert block, "docs/models.md lost its quickstart block"
    return block.group(1)


@pytest.mark.slow
def test_the_quickstart_shows_a_completion_and_evictions():
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(_quickstart(), "docs/models.md", "exec"), scope)
    assert scope["completion"].strip() and scope["completion"].strip() in printed.getvalue()
    stats = scope["cache"].stats()
    assert stats["evictions"] >= 1 and max(stats["peak_entries"]) <= 64 + 16


@pytest.mark.slow
def test_a_transformers_loaded_copy_runs_the_shipped_scorer_token_for_token(smollm2, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tok = smollm2
    model.save_pretrained(tmp_path / "copy")
    copy = AutoModelForCausalLM.from_pretrained(tmp_path / "copy")  # as a user loads it: another name, no foresight
    assert copy.config._name_or_path != model.config._name_or_path
    messages = [{"role": "user", "content": "List three prime numbers and explain why each is prime."}]
    inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)

    def run(m):
        cache = foresight.BudgetedCache(m, "learned", budget=64, interval=16,
                                        policy_kwargs={"scorer": "smollm2-135m-b64-w16"})
        with torch.no_grad():
            out = m.generate(**inputs, past_key_values=cache, max_new_tokens=160, do_sample=False)
        return out, cache.stats()["evictions"]

    (ours, ev_ours), (theirs, ev_theirs) = run(model), run(copy)
    assert ev_ours >= 1 and ev_ours == ev_theirs
    assert torch.equal(ours, theirs)
