"""Golden labelling cost for one long trace: time and peak memory vs. materialising full N x N attention.

Labels one teacher-forced trace of ``--tokens`` tokens (MATH-500 problems and reference solutions concatenated
into the model's chat format; any text works for a teacher-forced trace) at budget B and interval W, and
prints, side by side in one run:

* wall time of a plain full-cache replay of the same trace (the forward-sized baseline), of the oracle's
  block-attention pass, of the greedy schedule, and their ratio;
* peak memory added by labelling (CPU: peak RSS over the pre-run RSS; CUDA: peak allocated over the baseline)
  next to the analytic size of the block-averaged attention ā (L x Hkv x N x N/W fp32) and of full N x N fp32
  attention for every layer and query head (what a naive oracle would hold).

Usage: ``python benchmarks/bench_golden.py [--model smollm2-135m --tokens 4096 --budget 256 --interval 64]``
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from foresight.errors import ForesightError, OneLineParser, run_script


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM); False where not permitted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory added by a block of code: CUDA allocator stats on GPU, VmHWM - VmRSS on CPU (Linux)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.exact = _reset_peak()
            self.base = _rss_kb("VmRSS") * 1024
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.peak = _rss_kb("VmHWM") * 1024 - self.base


def build_trace(tokenizer, tokens: int) -> list[int]:
    from foresight.data import data_dir
    from foresight.prompts import build_prompt

    ids: list[int] = []
    with (data_dir() / "math500_dev.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            text = build_prompt(tokenizer, rec["problem"]) + rec["solution"] + "\n"
            ids += tokenizer(text)["input_ids"]
            if len(ids) >= tokens:
                return ids[:tokens]
    raise ForesightError(f"not enough text for {tokens} tokens")


def gib(x: float) -> str:
    return f"{x / 2**30:.3f} GiB"


def main() -> None:
    from foresight.config import check_device, positive_int
    from foresight.schedule import cache_config_arg

    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=positive_int, default=4096)
    ap.add_argument("--budget", type=positive_int, default=256)
    ap.add_argument("--interval", type=positive_int, default=64)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    check_device(args.device, "--device")
    cache_config_arg(args.budget, args.interval)  # W >= B ran and timed a setting no policy can use
    if args.tokens <= args.budget + args.interval:
        raise ForesightError(f"--tokens {args.tokens}: must exceed B + W = {args.budget + args.interval} for an "
                             "eviction event to label")

    import foresight
    from golden.oracle import block_attention, greedy_schedule

    model, tok = foresight.load_model(args.model, device=args.device)
    device = model.device
    ids = build_trace(tok, args.tokens)
    n, b, w = len(ids), args.budget, args.interval
    num_layers, hq = model.config.num_hidden_layers, model.config.num_attention_heads
    hkv = model.config.num_key_value_heads or hq
    warm = ids[: 2 * (b + w)]  # warm-up (kernels, allocator) outside the measurements
    foresight.replay(model, [warm], policy="full", chunk=w)
    block_attention(model, warm, b, w)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    with PeakMemory(device) as mem_replay:
        t0 = time.perf_counter()
        foresight.replay(model, [ids], policy="full", chunk=w)
        sync()
        t_replay = time.perf_counter() - t0
    with PeakMemory(device) as mem_label:
        t0 = time.perf_counter()
        abar, pieces = block_attention(model, ids, b, w)
        sync()
        t_attn = time.perf_counter() - t0
        t0 = time.perf_counter()
        events = greedy_schedule(abar, pieces, b, w, inplace=True)
        sync()
        t_sched = time.perf_counter() - t0

    abar_bytes = num_layers * hkv * n * len(pieces) * 4
    full_bytes = num_layers * hq * n * n * 4
    print(f"model {args.model} on {device}: L={num_layers} Hq={hq} Hkv={hkv}; trace N={n} tokens, B={b} W={w}")
    print(f"blocks {len(pieces)}, eviction events {len(events)}")
    print(f"full-cache replay (baseline)     {t_replay:8.2f} s   peak +{gib(mem_replay.peak)}")
    print(f"golden: block attention pass     {t_attn:8.2f} s")
    print(f"golden: greedy schedule          {t_sched:8.2f} s")
    print(f"golden: total labelling          {t_attn + t_sched:8.2f} s   peak +{gib(mem_label.peak)}")
    print(f"labelling time / replay time     {(t_attn + t_sched) / t_replay:8.2f} x")
    print(f"block-averaged attention (analytic, L*Hkv*N*nblocks fp32): {gib(abar_bytes)}")
    print(f"full NxN attention, every layer and query head (analytic, fp32): {gib(full_bytes)}")
    print(f"full NxN / measured labelling peak: {full_bytes / max(mem_label.peak, 1):.0f} x")
    if device.type == "cpu" and not mem_label.exact:
        print("note: could not reset the peak-RSS counter; CPU peaks are upper bounds")


if __name__ == "__main__":
    run_script(main, "bench_golden")
