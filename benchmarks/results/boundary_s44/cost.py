"""Why the boundary loss fails sampled (session 44): the future attention each scorer's evictions remove.

``python benchmarks/results/boundary_s44/cost.py NAME=SCORER_DIR ...``: on the golden-trajectory events of the 8
traces held out inside training (the recipe's split: heldout=8, split_seed 0; features from the feature cache
runs/quality/features), for each scorer and each (event, layer, KV head) row, the summed foresight value α of the W
entries it would evict, top-k and sampled at T=0.005 (the `learned` policy's Plackett–Luce draw, 8 draws a row, seeded),
divided by golden's (the least any eviction can remove), pooled over rows. Also the share of those draws that evict
an entry of the top half of the row's α (an entry the oracle ranks well inside the kept set), and the median over
rows of the standard deviation of a row's scores (the scale a sampling temperature acts on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from foresight.features import FEATURE_GROUPS, feature_columns
from foresight.sampling import sample_eviction, top_keep
from foresight.scorer import Scorer
from training.sl import SLData
from training.sl_config import SLConfig
from training.sl_features import FeatureCache

DRAWS, T = 8, 0.005


def main(specs: list[str]) -> None:
    scorers = {n: Scorer.from_pretrained(d) for n, d in (s.split("=", 1) for s in specs)}
    first = next(iter(scorers.values()))
    raw = json.loads((Path(specs[0].split("=", 1)[1]) / "config.json").read_text())["provenance"]["config"]
    cfg = SLConfig.from_dict({k: v for k, v in raw.items() if k in SLConfig.__dataclass_fields__})
    data = SLData(cfg)
    fp = first.config.fingerprint
    cache = FeatureCache(cfg.feature_cache, fp, cfg.budget, cfg.interval, cfg.decay, cfg.feature_dtype)
    cols = torch.tensor(feature_columns(cfg.feature_set, tuple(FEATURE_GROUPS), fp["head_dim"],
                                        fp["num_heads"] // fp["num_kv_heads"]))
    val = cache.load(data.val_rows, cols, data.labels)
    alpha, evicted = val["alpha"][:].float(), val["evicted"][:]  # (E, L, K, C)
    w = int(evicted[0, 0, 0].sum())
    golden = (alpha * evicted).sum()
    upper = alpha >= alpha.median(-1, keepdim=True).values
    print(f"{len(data.val_rows)} traces, {alpha.shape[0]} events, {alpha[..., 0].numel()} rows, W={w}")
    for name, sc in scorers.items():
        with torch.no_grad():
            s = torch.cat([sc(val["features"][i:i + 8].float().transpose(0, 1)).transpose(0, 1)
                           for i in range(0, alpha.shape[0], 8)])
        c = s.shape[-1]  # top-k evicts what the learned policy's top_keep does not keep (ties: the older kept)
        out = torch.ones_like(s, dtype=torch.bool).scatter_(-1, top_keep(s, c - w), False)
        topk = out.nonzero()[:, -1].view(*s.shape[:-1], w)
        lost_topk = alpha.gather(-1, topk).sum()
        gen = torch.Generator().manual_seed(0)
        lost_s, hit = 0.0, 0.0
        for _ in range(DRAWS):
            idx = sample_eviction(s, w, T, gen).order
            lost_s += alpha.gather(-1, idx).sum().item() / DRAWS
            hit += upper.gather(-1, idx).float().mean().item() / DRAWS
        print(f"{name}: removed α / golden's: top-k {lost_topk / golden:.3f}, sampled T={T} {lost_s / golden:.3f}; "
              f"sampled evictions from the top half of α {hit:.2%} (top-k {upper.gather(-1, topk).float().mean():.2%}); "
              f"median row score std {s.std(-1).median():.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
