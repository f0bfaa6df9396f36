"""KeyDiff: keep keys that differ from the average key (attention-free).

Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
Resource-Constrained Environments", 2025. https://arxiv.org/abs/2504.15364
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from foresight.policies.base import EvictionPolicy
from foresight.policies.registry import register_policy


@register_policy
@dataclass
class KeyDiffPolicy(EvictionPolicy):
    """KeyDiff: score = negative cosine similarity of each key to the anchor, the mean normalised key.

    The anchor is the mean of the L2-normalised keys of every valid entry of the layer's cache (candidates and
    the protected newest ``W``), per KV head and batch row; distinctive keys (far from the anchor) are kept,
    redundant ones evicted. Needs no attention, so it adds nothing to the decoding steps.
    """

    name = "keydiff"
    per_layer = True
    selects_rows = True  # no per-row state

    def score(self, view):
        keys = F.normalize(view.keys.float(), dim=-1)  # (b, Hkv, n, d)
        valid = view.valid[..., None].to(keys.dtype)
        anchor = (keys * valid).sum(dim=2, keepdim=True) / valid.sum(dim=2, keepdim=True).clamp(min=1)
        anchor = F.normalize(anchor, dim=-1)
        return -(keys[:, :, : view.num_candidates] * anchor).sum(-1)
