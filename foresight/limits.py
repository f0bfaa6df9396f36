"""Bounds checked before work: the model's context, the memory a batch needs, the size of a plan.

A prompt, a trace or a prompt plus its ``--max-new-tokens`` longer than the model's context
(``max_position_embeddings``) would be run at positions the model never saw, or hang on a quadratic prefill; a batch,
group or micro-batch whose tensors cannot fit would swap the machine to a standstill or die deep in a step. Each is
refused in one line naming the setting and the bound, before the work starts (and before anything is written):

* :func:`check_context`: a number of tokens against the model's context;
* :func:`check_memory`: an estimate of the bytes a step needs against the device's free memory
  (:func:`available_bytes`). Estimates count the large tensors only (KV caches, logits, recorded features), so they
  are lower bounds: what they refuse cannot fit, and what they pass may still not (then the out-of-memory error is
  one line too, :func:`foresight.errors.machine_limit`);
* :func:`check_planned`: the number of (problem, sample) pairs a job plans (one entry each in memory and on disk).
"""

from __future__ import annotations

import os

import torch

from foresight.errors import ForesightError

#: The most (problem, sample) pairs one ``trace`` or ``eval aime`` output directory plans.
MAX_PLANNED = 1_000_000
#: The largest sample index a trace records (its ``sample`` column is int32).
MAX_SAMPLE_INDEX = 2**31 - 1


def model_context(model) -> int | None:
    """The positions the model was trained for (``config.max_position_embeddings``); None when it records none."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def check_context(model, tokens: int, what: str, fix: str) -> None:
    """Refuse ``tokens`` positions (``what``: how they add up) beyond the model's context; ``fix`` says what to
    change."""
    ctx = model_context(model)
    if ctx is not None and tokens > ctx:
        raise ForesightError(f"{what} = {tokens:,} tokens, more than the model's context of {ctx:,} positions "
                             f"(max_position_embeddings); {fix}")


def check_new_tokens(model, prompt_tokens: int, new_tokens: int, flag: str) -> None:
    """Refuse a prompt of ``prompt_tokens`` plus ``new_tokens`` generated (``flag``: the setting's name) beyond the
    model's context."""
    ctx = model_context(model)
    room = f"pass {flag} {ctx - prompt_tokens} or less" if ctx is not None and ctx > prompt_tokens else \
        "shorten the prompt"
    check_context(model, prompt_tokens + new_tokens, f"the longest prompt ({prompt_tokens:,} tokens) + {flag} "
                  f"{new_tokens:,}", room)


def kv_bytes_per_token(model) -> int:
    """Bytes of one token's keys and values over every layer (the budgeted cache's unit of memory)."""
    from foresight.models import model_shape  # here: commands import this module before they load transformers

    layers, hq, hkv = model_shape(model)
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // hq
    return 2 * layers * hkv * head_dim * next(model.parameters()).element_size()


def available_bytes(device: torch.device | str) -> int | None:
    """Free memory of ``device``: the CUDA device's free memory plus what torch holds unused there, or the host's
    available memory (``MemAvailable``); None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_memory(need: float, device: torch.device | str, what: str, fix: str) -> None:
    """Refuse ``what`` (the setting, e.g. ``group_size=64 x micro_batch=2``) when the estimated ``need`` bytes exceed
    what ``device`` has free (:func:`available_bytes`); ``fix`` says what to lower."""
    free = available_bytes(device)
    if free is not None and need > free:
        raise ForesightError(f"{what} needs about {_gib(need)} of memory, more than the {_gib(free)} free on "
                             f"{torch.device(device)}; {fix}")


def check_generation(model, rows: int, prompt_tokens: int, new_tokens: int, kept: int | None = None) -> None:
    """Refuse generating ``new_tokens`` after prompts of up to ``prompt_tokens`` beyond the model's context, or for
    ``rows`` sequences whose KV caches (``kept`` entries each at most: a budget's B + W; all tokens by default) cannot
    fit on the model's device. Library-level names (``max_new_tokens``); commands check the same with their flags."""
    check_new_tokens(model, prompt_tokens, new_tokens, "max_new_tokens")
    tokens = prompt_tokens + new_tokens if kept is None else min(prompt_tokens + new_tokens, kept)
    check_memory(rows * tokens * kv_bytes_per_token(model), model.device, f"a batch of {rows:,} sequences of "
                 f"{tokens:,} cached tokens", "generate fewer sequences together (a smaller batch size)")


def check_replay(model, rows: int, longest: int, kept: int | None, piece: int) -> None:
    """Refuse replaying sequences longer than the model's context, or ``rows`` of them together whose KV caches
    (``kept`` entries each at most, all tokens when None) and one piece's logits cannot fit on the model's device."""
    check_context(model, longest, "the longest sequence replayed", "replay sequences made by this model, or cut them "
                  "to its context")
    tokens = longest if kept is None else min(longest, kept + piece)
    vocab = model.get_input_embeddings().num_embeddings
    need = rows * (tokens * kv_bytes_per_token(model) + min(piece, longest) * vocab * 4)
    check_memory(need, model.device, f"replaying {rows:,} sequences of up to {longest:,} tokens together",
                 "replay fewer together (a smaller batch or group size)")


def check_planned(problems: int, samples: int, first_sample: int = 0, flags: tuple[str, str] = ("--samples",
                                                                                                  "--first-sample"),
                  ) -> None:
    """Refuse a plan of more than :data:`MAX_PLANNED` (problem, sample) pairs, or sample indices past
    :data:`MAX_SAMPLE_INDEX`, before anything is planned (``flags``: how the caller names the two settings)."""
    last = first_sample + samples - 1
    if last > MAX_SAMPLE_INDEX:
        raise ForesightError(f"{flags[1]} {first_sample} with {flags[0]} {samples}: sample indices up to {last:,}, "
                             f"past the largest a trace records ({MAX_SAMPLE_INDEX:,})")
    if problems * samples > MAX_PLANNED:
        raise ForesightError(f"{problems:,} problems x {flags[0]} {samples:,} = {problems * samples:,} samples, more "
                             f"than the {MAX_PLANNED:,} one output directory plans; split the work over several")


__all__ = ["MAX_PLANNED", "MAX_SAMPLE_INDEX", "available_bytes", "check_context", "check_generation", "check_memory",
           "check_new_tokens", "check_planned", "check_replay", "kv_bytes_per_token", "model_context"]
