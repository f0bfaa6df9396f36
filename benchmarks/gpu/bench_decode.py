"""Decode throughput on one GPU: the foresight runtime against transformers' own generation, side by side.

Random-weight models of real shapes (SmolLM2-135M's and Qwen3-4B's configurations, built here without any download),
bf16, greedy, EOS ignored, random prompt tokens of one length (no padding). For every row of the table each side
generates the same number of tokens once after a warm-up run (the warm-up compiles what compiles); tokens/s are over
the whole batch. Columns: ``foresight.generate`` with ``full``, ``h2o`` and ``learned`` (a random scorer of the
model's shape at the row's B/W: speed only), ``foresight.generate`` with ``h2o`` and ``learned`` on the static
cache, its decode step compiled (:mod:`foresight.static_cache`: ``torch.compile`` mode ``reduce-overhead``, CUDA
graphs; a warm-up run of the row's shapes compiles it; ``learned`` with its events compiled too, ``compile=``),
``model.generate`` with a :class:`~foresight.cache.BudgetedCache` (h2o), ``model.generate`` with its dynamic cache,
and with its static cache compiled (``cache_implementation="static"``, which transformers compiles on a GPU). Peak KV
is what the budgeted cache held against the full cache.

    python benchmarks/gpu/bench_decode.py                       # the three rows of the decode table (one GPU, ~8 min)
    python benchmarks/gpu/bench_decode.py --dry-run             # tiny model on the CPU: checks the script runs
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
import transformers

import foresight
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.policies import make_policy
from foresight.scorer import Scorer, ScorerConfig
from foresight.static_step import StaticConfig

#: Configurations of the real models (no weights: they are drawn at random).
SHAPES = {
    "smollm2-135m": ("LlamaConfig", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                                         tie_word_embeddings=True)),
    "qwen3-4b": ("Qwen3Config", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                     max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                     tie_word_embeddings=True)),
    "tiny": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=261, max_position_embeddings=4096)),
}
#: (shape, batch, prompt tokens, new tokens, B, W): the rows of the decode throughput table (docs/gpu.md).
ROWS = [("smollm2-135m", 32, 1000, 256, 256, 64), ("smollm2-135m", 128, 1000, 256, 256, 64),
        ("qwen3-4b", 16, 2000, 256, 512, 128)]
DRY_ROWS = [("tiny", 2, 40, 24, 16, 4)]
SIDES = ("foresight full", "foresight h2o", "foresight learned", "foresight h2o compiled",
         "foresight learned compiled", "HF + BudgetedCache h2o", "HF dynamic", "HF static compiled")


def build(shape: str, device: str, dtype: torch.dtype):
    cls, kwargs = SHAPES[shape]
    config = getattr(transformers, cls)(**kwargs, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._name_or_path = f"random-{shape}"
    with torch.device(device):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def row(model, batch: int, prompt: int, new: int, budget: int, interval: int, sides,
        static: StaticConfig = StaticConfig()) -> dict:
    device = model.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt), generator=gen)
    rows = ids.tolist()
    ids, mask = ids.to(device), torch.ones_like(ids).to(device)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=None, decode=lambda *a, **k: "")
    scorer = Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=budget, interval=interval,
                                 feature_set=("prekey", "value", "attn", "age"), hidden=48), seed=0)
    stats = {}

    def ours(policy, n, compiled=False):
        def run():
            res = foresight.generate(model, tok, rows, policy=policy, budget=None if policy == "full" else budget,
                                     interval=None if policy == "full" else interval, max_new_tokens=n,
                                     stop_on_eos=False, static=static if compiled else False)
            stats[res.stats["policy"]] = res.stats
        return run

    def hf(n, **kw):
        return lambda: model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                      min_new_tokens=n, **kw)

    def hf_cache(n):
        return lambda: model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                      min_new_tokens=n,
                                      past_key_values=foresight.BudgetedCache(model, "h2o", budget, interval))

    make = {"foresight full": lambda n: ours("full", n), "foresight h2o": lambda n: ours("h2o", n),
            "foresight learned": lambda n: ours(make_policy("learned", scorer=scorer), n),
            "foresight h2o compiled": lambda n: ours("h2o", n, compiled=True),
            "foresight learned compiled": lambda n: ours(
                make_policy("learned", scorer=scorer, compile=static.backend), n, compiled=True),
            "HF + BudgetedCache h2o": hf_cache, "HF dynamic": lambda n: hf(n),
            "HF static compiled": lambda n: hf(n, cache_implementation="static")}
    out = {}
    with torch.inference_mode():
        for side in sides:
            make[side](new)()  # warm-up: compiles and plans what it will
            _sync(device)
            t0 = time.perf_counter()
            make[side](new)()
            _sync(device)
            out[side] = batch * new / (time.perf_counter() - t0)
    full = stats.get("full", {}).get("peak_entries")
    h2o = stats.get("h2o", {}).get("peak_entries")
    out["peak KV vs full"] = sum(h2o) / sum(full) if full and h2o else None
    return out


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU, fp32: checks the script")
    ap.add_argument("--shapes", default=None, help="only these shapes (comma-separated)")
    ap.add_argument("--sides", default=None, help=f"only these columns (comma-separated, of: {', '.join(SIDES)})")
    ap.add_argument("--backend", default=None,
                    help="torch.compile backend of the compiled columns (default: inductor; eager for --dry-run)")
    args = ap.parse_args(argv)
    sides = SIDES if args.sides is None else tuple(s.strip() for s in args.sides.split(","))
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise ForesightError(f"--sides: unknown column {unknown[0]!r}; choose from {', '.join(SIDES)}")
    static = StaticConfig(backend=args.backend or ("eager" if args.dry_run else "inductor"))
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    rows = DRY_ROWS if args.dry_run else [r for r in ROWS if not args.shapes or r[0] in args.shapes.split(",")]
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), {dtype}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}; tokens/s over the batch")
    print("| shape, batch, prompt + new, B/W | " + " | ".join(sides) + " | peak KV h2o / full |")
    print("|---|" + "---:|" * (len(sides) + 1))
    models = {}
    for shape, batch, prompt, new, budget, interval in rows:
        if shape not in models:
            models.clear()
            models[shape] = build(shape, device, dtype)
        got = row(models[shape], batch, prompt, new, budget, interval, sides, static)
        full = got.get("foresight full")
        cells = [f"{got[s]:.0f}" + (f" ({got[s] / full:.2f}x)" if full and s != "foresight full" else "")
                 for s in sides]
        kv = f"{got['peak KV vs full']:.2f}" if got["peak KV vs full"] is not None else "-"
        print(f"| {shape}, {batch}, {prompt}+{new}, {budget}/{interval} | " + " | ".join(cells) + f" | {kv} |",
              flush=True)
    return 0


if __name__ == "__main__":
    run_script(main, "bench_decode")
