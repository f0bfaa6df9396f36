"""The one eviction schedule (docs/runtime.md), defined once for generation, replay, the oracle and training.

With budget ``B`` and interval ``W`` an event fires when the cache holds ``B + W`` entries: the ``W`` lowest-scoring
of the ``B`` oldest entries are evicted and the cache returns to ``B``. Counted in tokens fed (prompt, padding and
generated tokens alike), the events therefore fall at ``B + W``, ``B + 2W``, ... whatever the prompt length: a
forward that would cross an event point is fed in pieces cut at those points (chunked prefill), so generating a
sequence and replaying it evict at identical moments. With the prompt protected, the prompt's ``P`` entries sit
on top of the budget and the points move to ``P + B + W``, ``P + B + 2W``, ...
"""

from __future__ import annotations

from dataclasses import dataclass

from foresight.errors import ForesightError


@dataclass(frozen=True)
class CacheConfig:
    """Budget ``B``, interval ``W``, sink tokens and prompt protection, validated on construction.

    ``budget=None`` means an unbounded cache (the ``full`` reference); ``interval`` defaults to ``B // 4``.
    """

    budget: int | None = None
    interval: int | None = None
    sinks: int = 0
    protect_prompt: bool = False

    def __post_init__(self):
        if self.budget is None:
            return
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget <= 0:
            raise ValueError(f"budget must be a positive integer, got {self.budget!r}")
        if self.interval is None:
            object.__setattr__(self, "interval", max(1, self.budget // 4))
        if isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval <= 0:
            raise ValueError(f"interval must be a positive integer, got {self.interval!r}")
        if self.interval >= self.budget:
            raise ValueError(
                f"interval ({self.interval}) must be smaller than budget ({self.budget}): the newest W entries "
                "are protected, so the budget must leave room for candidates to keep"
            )
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int):
            raise ValueError(f"sinks must be an integer, got {self.sinks!r}")
        if self.sinks < 0 or self.sinks > self.budget - self.interval:
            raise ValueError(f"sinks must be in [0, budget - interval], got {self.sinks}")


def cache_config_arg(budget: int | None, interval: int | None, sinks: int = 0,
                     flags: str = "--budget/--interval") -> CacheConfig:
    """:class:`CacheConfig` of command-line values; a bad combination (W >= B, sinks past B - W) is a one-line user
    error naming ``flags``, raised before any model is loaded."""
    try:
        return CacheConfig(budget, interval, sinks)
    except ValueError as exc:
        raise ForesightError(f"{flags}: {exc}") from None


def next_event(fed: int, budget: int | None, interval: int | None, offset: int = 0) -> int | None:
    """The first event point strictly after ``fed`` tokens (None for an unbounded cache).

    ``offset`` shifts the schedule (the protected prompt's width).
    """
    if budget is None:
        return None
    first = offset + budget + interval
    if fed < first:
        return first
    return first + ((fed - first) // interval + 1) * interval


def replay_schedule(
    length: int, budget: int | None, interval: int | None, chunk: int | None = None, start: int = 0, offset: int = 0
) -> list[tuple[int, int, bool]]:
    """Pieces ``(start, end, evict_after)`` in which tokens ``start .. length-1`` are fed.

    Pieces hold at most ``chunk`` tokens (default ``W``) and end exactly at the event points of
    :func:`next_event`, so feeding them evicts where token-by-token decoding does. Golden labelling uses the same
    pieces, so the oracle's blocks and the replay's events coincide.
    """
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    if budget is None:
        step = chunk or interval or 64
        return [(s, min(s + step, length), False) for s in range(start, length, step)]
    chunk = chunk or interval
    pieces, pos = [], start
    while pos < length:
        event = next_event(pos, budget, interval, offset)
        end = min(pos + chunk, event, length)
        pieces.append((pos, end, end == event))
        pos = end
    return pieces
