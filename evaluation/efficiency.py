"""Efficiency of budgeted decoding (docs/evaluation.md): tokens/s and peak KV bytes against the full cache.

All policies (and the full cache, always included) generate exactly ``new_tokens`` tokens from the same prompt
(``stop_on_eos=False``) in one process, side by side: each repeat runs every policy once, in an order rotated
from repeat to repeat, so slow drifts of a shared machine hit all policies alike. The reported speed is the
median over repeats of ``new_tokens / wall time of generate`` (prefill of the short prompt included).
Time spent inside the policy's hooks (``observe``, ``score``, ``select``, ``on_evict`` and their all-layers forms; for
``learned`` this is feature extraction plus the scorer) is measured separately as ``policy_seconds``.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
from tqdm.auto import tqdm

from foresight.atomic import atomic_write_text
from foresight.errors import ForesightError
from foresight.generation import generate
from foresight.models import model_fingerprint
from foresight.outputs import OutputKind, prepare_output_dir
from foresight.policies import EvictionPolicy, make_policy
from foresight.policies.base import require_cache
from foresight.schedule import CacheConfig

#: ``bench``'s output directory.
BENCH_OUTPUT = OutputKind("bench", ("bench.json", "bench.md"), (("bench.json", "bench.md"),))

DEFAULT_PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " \
                 "How many clips did Natalia sell altogether in April and May?"
#: ``bench --compile``: the eager cache, the static cache's compiled decode step, or both side by side.
COMPILE_CHOICES = ("no", "yes", "both")
_HOOKS = ("observe", "observe_layers", "score", "score_layers", "select", "on_evict", "on_evict_layers")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _HookTimer:
    """Wraps a policy instance's hooks to accumulate the wall time spent inside them (a hook called from another,
    e.g. ``observe`` from ``observe_layers``, is counted once, in the outer one)."""

    def __init__(self, policy: EvictionPolicy, device: torch.device):
        self.seconds = 0.0
        self._depth = 0
        for name in _HOOKS:
            fn = getattr(policy, name)

            def wrapped(*args, _fn=fn, **kwargs):
                if self._depth:
                    return _fn(*args, **kwargs)
                self._depth += 1
                try:
                    _sync(device)
                    t0 = time.perf_counter()
                    out = _fn(*args, **kwargs)
                    _sync(device)
                    self.seconds += time.perf_counter() - t0
                finally:
                    self._depth -= 1
                return out

            setattr(policy, name, wrapped)


def kv_bytes(model, entries_per_layer: Sequence[int], batch_size: int) -> int:
    """Bytes of keys + values for ``entries_per_layer`` cache entries per (layer, KV head)."""
    fp = model_fingerprint(model)
    elem = next(model.parameters()).element_size()
    return int(sum(entries_per_layer)) * batch_size * fp["num_kv_heads"] * fp["head_dim"] * 2 * elem


def benchmark(
    model,
    tokenizer,
    policies: Sequence[str | EvictionPolicy],
    budget: int,
    interval: int,
    new_tokens: int,
    *,
    repeats: int = 3,
    prompt: str | None = None,
    batch_size: int = 1,
    sinks: int = 0,
    policy_factory: Callable[[str, int], EvictionPolicy | None] | None = None,
    warmup: bool = True,
    compile: str = "no",
    progress: bool = False,
) -> list[dict]:
    """Measure decode speed and peak KV memory of each policy against the full cache, side by side.

    Returns one record per policy (``full`` first) with ``tokens_per_s`` (median), ``seconds`` (all repeats),
    ``peak_kv_entries`` (max per layer), ``peak_kv_bytes`` (K+V over all layers), ``policy_seconds`` (median
    time inside the policy's hooks), ``policy_overhead`` (its share of the wall time) and the ratios
    ``speed_vs_full`` / ``kv_bytes_vs_full``.

    ``compile``: ``no`` (the eager cache), ``yes`` (every policy on the static cache with its compiled decode step,
    :mod:`foresight.static_cache`) or ``both`` (each policy both ways, interleaved; the compiled rows are named
    ``<policy> compiled``). A policy the static cache cannot take is refused. With the static cache the warm-up is
    one whole untimed run of each side (it compiles the step for the shapes the timed runs use).

    ``progress``: a bar on stderr over the whole runs (the untimed warm-ups, then policies x repeats), naming the one
    in flight.
    """
    if new_tokens <= 0 or repeats <= 0 or batch_size <= 0:
        raise ForesightError("--new-tokens, --repeats and --batch-size must be positive")
    try:
        CacheConfig(budget, interval, sinks)
    except ValueError as exc:
        raise ForesightError(str(exc)) from None
    if compile not in COMPILE_CHOICES:
        raise ForesightError(f"--compile must be one of {', '.join(COMPILE_CHOICES)}, got {compile!r}")
    factory = policy_factory or (lambda name, b: make_policy(name))
    built: dict[str, EvictionPolicy] = {"full": make_policy("full")}
    for p in policies:
        pol = p if isinstance(p, EvictionPolicy) else factory(p, budget)
        if pol is None:
            raise ForesightError(f"policy {p!r} is not available at B={budget}")
        if getattr(pol, "replay_only", False):
            raise ForesightError(f"policy {pol.name!r} only replays fixed traces; it cannot generate")
        require_cache(pol, budget, interval)  # before the first timed run
        # by the spec asked for: two specs of one policy class (caote:h2o, caote:tova) share its name, and keying by
        # the name measured only the first, under the bare name
        built.setdefault(p if isinstance(p, str) else pol.name, pol)
    compiled = _compiled_sides(built, compile, budget)
    device = model.device
    timers = {name: _HookTimer(pol, device) for name, pol in built.items()}
    prompts = [prompt or DEFAULT_PROMPT] * batch_size

    def run(name: str) -> tuple[float, float, dict]:
        pol = built[name]
        t_hooks = timers[name].seconds
        _sync(device)
        t0 = time.perf_counter()
        res = generate(model, tokenizer, prompts, policy=pol, budget=budget if pol.evicts else None,
                       interval=interval if pol.evicts else None, sinks=sinks, max_new_tokens=new_tokens,
                       stop_on_eos=False, static=name in compiled)
        _sync(device)
        elapsed = time.perf_counter() - t0
        got = min(len(t) for t in res.token_ids)
        if got != new_tokens:
            raise RuntimeError(f"{name}: generated {got} tokens instead of {new_tokens}")
        return elapsed, timers[name].seconds - t_hooks, res.stats

    names = list(built)
    # whole untimed runs: on CUDA the full cache first (cuDNN plans attention per new KV length: the full cache meets
    # every length of every policy's run; the first run would otherwise pay for them alone), then each compiled side
    # (it compiles the step for the timed runs' shapes)
    untimed = [*(["full"] if device.type == "cuda" else []), *compiled] if warmup else []
    bar = tqdm(total=len(untimed) + repeats * len(names), desc="bench", unit="run", disable=not progress)
    for name in untimed:
        bar.set_postfix_str(f"{name} (warm-up, untimed)")
        run(name)
        bar.update()
    if warmup:
        for name in names:
            generate(model, tokenizer, prompts[:1], policy=built[name], budget=budget if built[name].evicts else None,
                     interval=interval if built[name].evicts else None, sinks=sinks, max_new_tokens=4,
                     stop_on_eos=False)
    times: dict[str, list[float]] = {n: [] for n in names}
    hooks: dict[str, list[float]] = {n: [] for n in names}
    stats: dict[str, dict] = {}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            bar.set_postfix_str(name)
            elapsed, hook_s, st = run(name)
            times[name].append(elapsed)
            hooks[name].append(hook_s)
            stats[name] = st
            bar.update()
    bar.close()
    prompt_tokens = len(tokenizer(prompts[0])["input_ids"])
    records = []
    for name in names:
        med = statistics.median(times[name])
        peak = stats[name]["peak_entries"]
        records.append({
            "policy": name,
            "budget": budget if built[name].evicts else None,
            "interval": interval if built[name].evicts else None,
            "sinks": sinks if built[name].evicts else None,
            "new_tokens": new_tokens,
            "prompt_tokens": prompt_tokens,
            "batch_size": batch_size,
            "repeats": repeats,
            "seconds": times[name],
            "tokens_per_s": new_tokens * batch_size / med,
            "peak_kv_entries": max(peak),
            "peak_kv_bytes": kv_bytes(model, peak, batch_size),
            "policy_seconds": statistics.median(hooks[name]),
            "policy_overhead": statistics.median(hooks[name]) / med,
            "evictions": stats[name]["evictions"],
            "compiled": name in compiled,
        })
    full = records[0]
    for rec in records:
        rec["speed_vs_full"] = rec["tokens_per_s"] / full["tokens_per_s"]
        rec["kv_bytes_vs_full"] = rec["peak_kv_bytes"] / full["peak_kv_bytes"]
    return records


def refuse_uncompilable(policies: Iterable[EvictionPolicy], compile: str, budget: int) -> None:
    """Refuse, naming it, a policy the static cache cannot take when ``compile`` asks for it (``bench`` calls this
    before the model loads; :func:`benchmark` again for its own callers)."""
    if compile == "no":
        return
    from foresight.static_cache import static_reason

    for pol in policies:
        reason = static_reason(pol, budget if pol.evicts else None)
        if reason:
            raise ForesightError(f"--compile {compile}: {reason}")


def _compiled_sides(built: dict[str, EvictionPolicy], compile: str, budget: int) -> set[str]:
    """The sides of ``built`` that decode on the static cache (``both`` adds a ``<name> compiled`` side per policy,
    a policy object of its own); refuses a policy the static cache cannot take, naming it."""
    refuse_uncompilable(built.values(), compile, budget)
    if compile == "no":
        return set()
    if compile == "yes":
        return set(built)
    for name, pol in list(built.items()):
        built[f"{name} compiled"] = copy.deepcopy(pol)
    return {name for name in built if name.endswith(" compiled")}


def write_bench(out: str | Path, meta: dict, header: str, records: Sequence[dict]) -> tuple[Path, Path]:
    """Write ``bench.json`` (settings + records) and ``bench.md`` (header + :func:`bench_table`) into ``out``
    (atomically; ``bench``'s output directory, :data:`BENCH_OUTPUT`)."""
    out = prepare_output_dir(out, BENCH_OUTPUT)
    atomic_write_text(out / "bench.json", json.dumps({"settings": meta, "records": list(records)}, indent=2) + "\n")
    atomic_write_text(out / "bench.md", f"{header}\n\n{bench_table(records)}\n")
    return out / "bench.json", out / "bench.md"


def bench_table(records: Sequence[dict]) -> str:
    """Markdown table: full cache first, then the policies by decreasing speed."""
    rows = [records[0], *sorted(records[1:], key=lambda r: -r["tokens_per_s"])]
    lines = [
        "| policy | budget | tokens/s | × full | peak KV entries / layer | peak KV (MiB) | × full | "
        "time in policy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['budget'] if r['budget'] is not None else '-'} | {r['tokens_per_s']:.1f} | "
            f"{r['speed_vs_full']:.2f} | {r['peak_kv_entries']} | {r['peak_kv_bytes'] / 2**20:.2f} | "
            f"{r['kv_bytes_vs_full']:.2f} | {100 * r['policy_overhead']:.1f}% |"
        )
    return "\n".join(lines)


__all__ = ["BENCH_OUTPUT", "COMPILE_CHOICES", "DEFAULT_PROMPT", "bench_table", "benchmark", "kv_bytes", "refuse_uncompilable",
           "write_bench"]
