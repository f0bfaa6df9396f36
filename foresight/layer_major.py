"""Layer-major replay: each layer's projections and MLP run over a span of pieces at once, its attention piece by
piece with that layer's evictions in between (docs/runtime.md).

Piecewise replay (:func:`foresight.runtime.replay`) feeds a sequence in the schedule's pieces of at most ``W``
tokens, one model forward each, so every weight is read once per piece: on a CPU a W=16 replay of SmolLM2 costs
several times the one-piece forward. But a layer's keys and values depend only on that layer's input, and a
per-layer policy (``per_layer = True``, :mod:`foresight.policies.base`) decides at layer ``l`` from layer ``l``'s
keys, values and attention alone. So the pieces can be fed layer by layer instead: one forward over a *span* of
consecutive pieces, in which every layer's projections, RoPE and MLP run over the whole span and its attention runs
piece by piece (:func:`foresight.attention.span_attention`): append the piece's keys and values to the layer,
attend, let the policy observe, and at the piece's event evict that layer, all through the same
:class:`~foresight.cache.BudgetedCache`, layers and policy as piecewise replay (the cache decides when and what to
evict, :meth:`~foresight.cache.BudgetedCache.leave_piece`). Each piece's queries see exactly the entries they see
piecewise, so per-token CE, evictions, the policy's state and gradients agree up to the float rounding of larger
matrix products.

A span is a run of the cache's own schedule pieces of at most ``limit`` tokens (:func:`spans`;
:func:`foresight.runtime.replay` uses :data:`~foresight.runtime.FULL_PIECE`, so a span's logits take no more memory
than one forward of the full-cache reference). A policy that does not declare ``per_layer`` is replayed piecewise,
and the reason is printed once (:func:`layer_major_reason`, :func:`note_piecewise`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

Piece = tuple[int, int, bool]

#: Replay engines: ``auto`` is layer-major for per-layer policies and piecewise otherwise.
ENGINES = ("auto", "layer-major", "piecewise")

_NOTED: set[str] = set()


@dataclass
class Span:
    """Pieces ``(start, end, fires)`` of one layer-major forward (consecutive, absolute token indices) and the cache's
    counters where it starts (``step``, ``event``); per layer, the events it has had in the span (``fired``) and
    whether it holds padding (``padded``, the piecewise ``_has_padding`` flag). ``positions``/``valid`` (batch,
    span) are the whole span's, declared when its forward begins."""

    pieces: list[Piece]
    step: int
    event: int
    fired: list[int]
    padded: list[bool]
    detach: bool = False  # truncated backpropagation: cut each layer's cached entries after every piece
    positions: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    piece_padded: list[bool] = field(default_factory=list)

    @property
    def start(self) -> int:
        return self.pieces[0][0]

    @property
    def length(self) -> int:
        return self.pieces[-1][1] - self.start

    def bounds(self) -> list[tuple[int, int]]:
        """Each piece's ``(start, end)`` within the span."""
        return [(s - self.start, e - self.start) for s, e, _ in self.pieces]

    def declare(self, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """The span's token positions and validity (batch, span); notes which pieces hold padding (one read)."""
        if positions.shape[1] != self.length:
            raise ValueError(f"a span of {self.length} tokens got a forward of {positions.shape[1]}")
        self.positions, self.valid = positions, valid
        padded = (~valid).any(0).tolist()
        self.piece_padded = [any(padded[s:e]) for s, e in self.bounds()]


def spans(pieces: list[Piece], limit: int) -> list[list[Piece]]:
    """Consecutive ``pieces`` grouped into spans of at most ``limit`` tokens (a longer piece is a span alone)."""
    out: list[list[Piece]] = []
    for piece in pieces:
        if out and piece[1] - out[-1][0][0] <= limit:
            out[-1].append(piece)
        else:
            out.append([piece])
    return out


def layer_major_reason(policy) -> str | None:
    """None when ``policy`` can be replayed layer-major; otherwise why not (one line)."""
    if not getattr(policy, "per_layer", False):
        return (f"policy {getattr(policy, 'name', type(policy).__name__)!r} does not declare per_layer = True (its "
                "decisions may read several layers or share state across them)")
    return None


def note_piecewise(reason: str) -> None:
    """Print once per process why a replay runs piecewise."""
    if reason not in _NOTED:
        _NOTED.add(reason)
        print(f"[foresight] note: replaying piecewise (one forward per piece, slower): {reason}", file=sys.stderr,
              flush=True)


__all__ = ["ENGINES", "Span", "layer_major_reason", "note_piecewise", "spans"]
