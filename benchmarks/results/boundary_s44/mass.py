"""How much of a row's `gap` pair weight lies across the oracle's evict/keep boundary (session 44).

``python benchmarks/results/boundary_s44/mass.py [LABELS] [N]``: over the golden events of the first N traces
(sorted by id; default 20) of a `foresight golden` output (default runs/quality/golden_train_B64_W16), the share of
the summed weights ``alpha_j - alpha_i`` (pairs with alpha_i < alpha_j) that `pair_weight=boundary` keeps (i evicted,
j kept), pooled and per (event, layer, KV head) row.
"""

from __future__ import annotations

import sys

import torch

from golden.labels import load_labels


def main(path: str = "runs/quality/golden_train_B64_W16", n: int = 20) -> None:
    labels = load_labels(path)
    ids = sorted(labels)[:n]
    cross = total = 0.0
    rows = []
    for t in ids:
        for ev in labels[t].events:
            a = ev.alpha.float()  # (L, Hkv, C)
            e = ev.evicted_mask()
            w = (a[..., None, :] - a[..., :, None]).clamp(min=0)  # w[i, j] = alpha_j - alpha_i
            row_all, row_cross = w.sum((-1, -2)), (w * (e[..., :, None] & ~e[..., None, :])).sum((-1, -2))
            rows.append((row_cross / row_all.clamp(min=1e-12)).flatten())
            cross, total = cross + row_cross.sum().item(), total + row_all.sum().item()
    f = torch.cat(rows)
    print(f"{len(ids)} traces, {f.numel()} rows: cross-boundary share of the gap weight pooled {cross / total:.3f}, "
          f"per row median {f.median():.3f} (quartiles {f.quantile(0.25):.3f}, {f.quantile(0.75):.3f})")


if __name__ == "__main__":
    main(*sys.argv[1:2], *(int(x) for x in sys.argv[2:3]))
