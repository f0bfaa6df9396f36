"""TOVA: Token Omission Via Attention, one keep-set per layer from the current query's attention.

Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024. https://arxiv.org/abs/2401.06104
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foresight.policies.base import EvictionPolicy
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class TOVAPolicy(EvictionPolicy):
    """TOVA: keep the tokens the current query attends to most, averaged over all heads of the layer.

    The score of a token is the attention of the newest query, averaged over every query head of the layer;
    all KV heads of a layer therefore share one score and keep the same tokens. TOVA evicts one token per
    step; we evict ``W`` at a time at the runtime's events, using the newest query before the event (in
    chunked replay, the chunk's last query: the same one).
    """

    name = "tova"
    per_layer = True
    selects_rows = True
    observes = True
    observes_layers = True
    attention_score = True

    def reset(self, batch_size, num_layers, device, **meta):
        self._last: list[torch.Tensor | None] = [None] * num_layers

    def select_rows(self, rows):
        self._last = [None if t is None else t.index_select(0, rows) for t in self._last]

    def observe(self, view):
        self._last[view.layer_idx] = view.probs[:, :, :, -1, :].mean(dim=(1, 2))  # (b, n)

    def score(self, view):
        last = self._last[view.layer_idx]
        if last is None or last.shape[-1] != view.keys.shape[2]:
            raise RuntimeError("tova: no attention observed for the current cache of this layer")
        b, h = view.keys.shape[:2]
        return last[:, None, : view.num_candidates].expand(b, h, -1)

    def on_evict(self, layer_idx, keep):
        self._last[layer_idx] = None
