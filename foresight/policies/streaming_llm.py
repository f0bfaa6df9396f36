"""StreamingLLM: attention sinks plus a sliding window of the most recent tokens.

Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024.
https://arxiv.org/abs/2309.17453
"""

from __future__ import annotations

from dataclasses import dataclass

from foresight.policies.base import EvictionPolicy, check_range
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class StreamingLLMPolicy(EvictionPolicy):
    """Keep the first ``sinks`` tokens and the most recent ones.

    Parameters
    ----------
    sinks
        Number of initial positions always kept (the paper uses 4).
    """

    name = "streaming_llm"
    per_layer = True
    selects_rows = True  # no per-row state
    sinks: int = 4

    def __post_init__(self):
        check_range("sinks", self.sinks, 0)

    def check_cache(self, budget, interval):
        if budget is not None and interval is not None and self.sinks > budget - interval:
            # every candidate would be a sink: the cache kept the oldest entries, not the most recent ones
            raise ValueError(f"streaming_llm: sinks ({self.sinks}) must be at most budget - interval "
                             f"({budget} - {interval} = {budget - interval}), the entries an event keeps besides "
                             "the newest W")

    def score(self, view):
        pos = view.candidate_positions.float()
        return pos + (pos < self.sinks).float() * 1e9
