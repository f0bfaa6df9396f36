"""Decode speed of the policies on a random-weight model of a real architecture's shape: GPU timings offline.

Decoding cost depends on a model's shape (layers, heads, widths, vocabulary) and on the cache, not on the values of
its weights, so a seeded random model of, say, Qwen3-4B's shape times the runtime honestly where the real weights
cannot be downloaded. The text such a model writes is noise; ``foresight bench`` generates a fixed number of tokens
(EOS ignored) anyway, so nothing depends on it. ``learned`` runs an untrained scorer of the shipped scorers'
feature set and width at the benchmark's (B, W), which costs what a trained one costs (as
``benchmarks/bench_scorer.py``). Never read quality from this: speed and memory only.

    python benchmarks/bench_shape.py --shape qwen3-4b --budget 1024 --interval 256 --new-tokens 4096 \
        --batch-size 8 --policies streaming_llm,h2o,lazy,learned --out runs/bench_qwen3_4b
"""

from __future__ import annotations

import torch
import transformers

from evaluation.efficiency import bench_table, benchmark, write_bench
from foresight.config import check_device
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.models import default_device, default_dtype, model_fingerprint, register_attention
from foresight.output_paths import check_output_dir
from foresight.policies import checked_policy, make_policy, policy_names
from foresight.schedule import cache_config_arg
from foresight.scorer import Scorer, ScorerConfig
from foresight.tiny_models import byte_tokenizer

#: Published configurations (layers, widths, heads, vocabulary, RoPE base) of the models the README names.
SHAPES: dict[str, tuple[str, dict]] = {
    "smollm2-135m": ("LlamaConfig", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                         rope_theta=100000.0, tie_word_embeddings=True)),
    "r1-distill-qwen-1.5b": ("Qwen2Config", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                                 rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen3-1.7b": ("Qwen3Config", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                       vocab_size=151936, rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3-4b": ("Qwen3Config", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                     rope_theta=1000000.0, tie_word_embeddings=True)),
}
#: The shipped scorer whose feature set and width ``learned`` copies (as ``benchmarks/bench_scorer.py --like``).
LIKE = "smollm2-135m-b64-w16"


def random_model(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A seeded random causal LM of ``shape`` on ``device`` (initialised there: no CPU copy of the weights)."""
    class_name, dims = SHAPES[shape]
    tok = byte_tokenizer()
    config = getattr(transformers, class_name)(
        **dims, max_position_embeddings=65536, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id)
    config._name_or_path = f"random-{shape}"
    register_attention()
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    model.eval().requires_grad_(False)
    return model, tok


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--interval", type=int, required=True)
    ap.add_argument("--new-tokens", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--policies", default="streaming_llm,h2o,lazy,learned")
    ap.add_argument("--device", default=None, help="default: cuda if available")
    ap.add_argument("--out", default=None, help="directory for bench.json and bench.md")
    args = ap.parse_args(argv)
    device = torch.device(check_device(args.device, "--device")) if args.device else default_device()
    check_output_dir(args.out, "--out")  # written after the benchmark
    dtype = default_dtype(device)
    names = [n for n in args.policies.split(",") if n and n != "full"]
    # everything checked before the (large) model is built (CacheConfig refuses W >= B, as the scorer does)
    cache_config_arg(args.budget, args.interval)
    if min(args.new_tokens, args.batch_size, args.repeats) <= 0:
        raise ForesightError("--new-tokens, --batch-size and --repeats must be positive")
    unknown = [n for n in names if n not in policy_names() or n == "golden"]
    if unknown:
        raise ForesightError(f"--policies: unknown or replay-only {', '.join(unknown)}")
    for name in names:  # a policy that does not take (B, W) (paged needs W a multiple of its block)
        if name != "learned":
            checked_policy(name, [(args.budget, args.interval)], f"--policies {name!r}")
    like = Scorer.from_pretrained(LIKE).config  # the shipped scorers' feature set and width
    model, tok = random_model(args.shape, device, dtype)
    fingerprint = model_fingerprint(model)

    def factory(name: str, budget: int):
        if name != "learned":
            return make_policy(name)
        cfg = ScorerConfig(fingerprint, budget=budget, interval=args.interval, feature_set=like.feature_set,
                           hidden=like.hidden, decay=like.decay, provenance={"trainer": "none (untrained, speed only)"})
        return make_policy("learned", scorer=Scorer(cfg, seed=0))

    records = benchmark(model, tok, names, args.budget, args.interval, args.new_tokens, repeats=args.repeats,
                        batch_size=args.batch_size, policy_factory=factory)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = (f"random-weight `{args.shape}` ({dtype}) on {gpu}, B={args.budget}, W={args.interval}, "
              f"{args.new_tokens} new tokens x batch {args.batch_size}, median of {args.repeats} interleaved repeats")
    print(header, "", bench_table(records), sep="\n")
    if args.out:
        meta = {"shape": args.shape, "device": gpu, "dtype": str(dtype), "fingerprint": fingerprint,
                "torch": torch.__version__, "transformers": transformers.__version__}
        write_bench(args.out, meta, header, records)
    return 0


if __name__ == "__main__":
    run_script(main, "bench_shape")
