"""Tiny random causal LMs for tests (2 layers, GQA), with a byte-level tokenizer: no download, fixed seed.

:func:`foresight.load_model` builds them by name (:data:`TINY_MODELS`: ``tiny-llama``, ``tiny-qwen2``,
``tiny-qwen3``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import transformers
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

_SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer():
    """A deterministic byte-level tokenizer (256 byte tokens + chat specials) needing no download."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(_SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        chat_template=_CHAT_TEMPLATE,
        padding_side="left",
    )


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny random test model (GQA: more query heads than KV heads)."""

    config_class: str
    extra: dict


TINY_MODELS: dict[str, TinySpec] = {
    "tiny-llama": TinySpec("LlamaConfig", {}),
    "tiny-qwen2": TinySpec("Qwen2Config", {}),
    "tiny-qwen3": TinySpec("Qwen3Config", {"head_dim": 16}),  # Qwen3 has q/k RMS norms
}


def build_tiny_model(name: str, seed: int = 0):
    """Build a tiny random causal LM (2 layers, 4 query heads, 2 KV heads, vocab 261) with a fixed seed."""
    spec = TINY_MODELS[name]
    tokenizer = byte_tokenizer()
    config = getattr(transformers, spec.config_class)(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        initializer_range=0.1,  # peaky attention, so eviction choices matter in tests
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **spec.extra,
    )
    config._name_or_path = name
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


__all__ = ["TINY_MODELS", "TinySpec", "build_tiny_model", "byte_tokenizer"]
