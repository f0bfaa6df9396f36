"""The scorer against the oracle: the pairwise ranking hinge loss that distillation minimises, and the ranking
metrics its validation reports (docs/training.md).

Shapes: keep scores and foresight values α are (L, ..., C), one row per (event, KV head) after the layer dim;
``evicted`` masks are bool with the golden evict set of each row.
"""

from __future__ import annotations

import torch


#: Pair weightings of :func:`pairwise_hinge_loss`: ``uniform`` (the method: every ordered pair counts once),
#: ``gap`` (a pair counts by how much attention a mis-ordering loses, ``alpha_j - alpha_i``, LambdaRank-style) and
#: ``boundary`` (``gap``, restricted to the pairs across the oracle's evict/keep boundary: the only swaps that change
#: which entries an eviction removes).
PAIR_WEIGHTS = ("uniform", "gap", "boundary")


def pairwise_hinge_loss(scores: torch.Tensor, alpha: torch.Tensor, margin: float = 0.01, max_pairs: int = 0,
                        generator: torch.Generator | None = None,
                        pair_weight: str = "uniform",
                        evicted: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairwise ranking hinge loss of keep scores against foresight values (docs/training.md).

    Rows are the leading dims after the first (events x heads); the first dim is the layer. With targets
    ``o = -alpha`` and eviction scores ``phi = -scores``, a row's loss is the mean over pairs ``(i, j)`` with
    ``o_i > o_j`` (i.e. ``alpha_i < alpha_j``) of ``max(0, m - (phi_i - phi_j)) = max(0, m - (s_j - s_i))``.
    Rows without any ordered pair are left out; the total is the mean over rows, summed over layers.

    ``max_pairs > 0`` samples that many ``(i, j)`` index pairs per row uniformly (with replacement) instead of
    using all ``C^2`` pairs: an unbiased estimate of each row's mean for large ``C``.

    ``pair_weight="gap"`` weights each ordered pair by ``alpha_j - alpha_i`` (a row's loss is then the weighted
    mean): evicting ``j`` instead of ``i`` loses that much future attention, so pairs of two negligible entries
    (most pairs: α spans orders of magnitude) no longer outweigh the few that decide what an eviction costs
    (Burges, "From RankNet to LambdaRank to LambdaMART", 2010, weights pairs by the metric change likewise).

    ``pair_weight="boundary"`` keeps the ``gap`` weight only for pairs with ``i`` in the oracle's evict set and ``j``
    outside it (``evicted``, bool, the shape of ``alpha``, required). An eviction removes the lowest-scored entries,
    so the order of two entries on the same side never changes what it removes: LambdaRank's weight, the metric
    change of a swap, is zero for them. Here the metric is the future attention an eviction removes.

    Returns
    -------
    (total, per_layer)
        Scalar loss and the (L,) per-layer losses.
    """
    if pair_weight not in PAIR_WEIGHTS:
        raise ValueError(f"pair_weight must be one of {', '.join(PAIR_WEIGHTS)}, got {pair_weight!r}")
    if (pair_weight == "boundary") != (evicted is not None):
        raise ValueError("pair_weight='boundary' needs the oracle's `evicted` mask, and only it uses one")
    if evicted is not None and evicted.shape != alpha.shape:
        raise ValueError(f"evicted has shape {tuple(evicted.shape)}, alpha {tuple(alpha.shape)}")
    L, c = scores.shape[0], scores.shape[-1]
    s = scores.reshape(L, -1, c)
    a = alpha.reshape(L, -1, c).to(s.dtype)
    ev = None if evicted is None else evicted.reshape(L, -1, c).to(s.device, torch.bool)
    if max_pairs and max_pairs < c * c:
        gen_dev = "cpu"
        i = torch.randint(c, (L, s.shape[1], max_pairs), generator=generator, device=gen_dev).to(s.device)
        j = torch.randint(c, (L, s.shape[1], max_pairs), generator=generator, device=gen_dev).to(s.device)
        ai, aj = a.gather(-1, i), a.gather(-1, j)
        pair = (aj - ai).clamp(min=0) if pair_weight != "uniform" else (ai < aj).to(s.dtype)
        if ev is not None:
            pair = pair * (ev.gather(-1, i) & ~ev.gather(-1, j))
        hinge = torch.relu(margin - (s.gather(-1, j) - s.gather(-1, i)))
        num, den = (pair * hinge).sum(-1), pair.sum(-1)
    else:
        diff = a[..., None, :] - a[..., :, None]  # diff[i, j] = alpha_j - alpha_i
        pair = diff.clamp(min=0) if pair_weight != "uniform" else (diff > 0).to(s.dtype)  # pair[i, j]: alpha_i < alpha_j
        if ev is not None:
            pair = pair * (ev[..., :, None] & ~ev[..., None, :])  # i evicted, j kept
        hinge = torch.relu(margin - (s[..., None, :] - s[..., :, None]))  # m - (s_j - s_i)
        num, den = (pair * hinge).sum((-1, -2)), pair.sum((-1, -2))
    has = den > 0
    row = num / den.clamp(min=1)
    per_layer = (row * has).sum(-1) / has.sum(-1).clamp(min=1)
    return per_layer.sum(), per_layer


def evict_overlap(scores: torch.Tensor, evicted: torch.Tensor) -> torch.Tensor:
    """Per-row fraction of the golden evict set that the lowest keep scores would also evict.

    ``scores`` (..., C) keep scores, ``evicted`` (..., C) bool golden evict mask with the same count per row.
    """
    k = evicted.sum(-1, keepdim=True)
    kmax = int(k.max()) if k.numel() else 0
    if kmax == 0:
        return torch.zeros(scores.shape[:-1])
    low = scores.float().argsort(dim=-1, descending=True, stable=True).flip(-1)[..., :kmax]  # what top-k evicts
    rank_ok = torch.arange(kmax, device=scores.device) < k  # rows with fewer evictions use their first k
    hit = evicted.gather(-1, low) & rank_ok
    return hit.sum(-1).float() / k.squeeze(-1).clamp(min=1).float()


def row_auc(scores: torch.Tensor, evicted: torch.Tensor) -> torch.Tensor:
    """Per-row ROC AUC of evicted-vs-kept when the lowest keep scores are evicted: the Mann-Whitney U statistic of
    ``-scores`` with average ranks for ties (what ``sklearn.metrics.roc_auc_score(evicted[r], -scores[r])`` gives,
    for all rows at once). ``scores`` (R, C), ``evicted`` (R, C) bool; NaN for a row with one class only."""
    s = scores.double()
    if not torch.isfinite(s).all():
        raise ValueError("keep scores contain NaN or infinity")
    srt = s.sort(-1).values
    below = torch.searchsorted(srt, s, side="left")  # entries scored strictly lower
    upto = torch.searchsorted(srt, s, side="right")  # ... lower or equal
    c = s.shape[-1]
    rank = (c - upto) + (upto - below + 1) / 2  # 1-based average rank of -score, ascending
    y = evicted.to(torch.bool)
    pos = y.sum(-1).double()
    neg = c - pos
    u = (rank * y).sum(-1) - pos * (pos + 1) / 2
    return u / (pos * neg)  # 0/0 = NaN for a one-class row


def ranking_metrics(scores: torch.Tensor, evicted: torch.Tensor, max_rows: int = 0, seed: int = 0) -> dict:
    """Mean evict-set overlap over all rows and mean per-row ROC AUC (:func:`row_auc`) of evicted-vs-kept over
    ``max_rows`` sampled rows (0: all), rows with one class left out."""
    c = scores.shape[-1]
    s = scores.reshape(-1, c).float().cpu()
    e = evicted.reshape(-1, c).cpu()
    overlap = evict_overlap(s, e)
    rows = torch.arange(s.shape[0])
    if max_rows and s.shape[0] > max_rows:
        rows = torch.randperm(s.shape[0], generator=torch.Generator().manual_seed(seed))[:max_rows]
    auc = row_auc(s[rows], e[rows])
    auc = auc[~auc.isnan()]
    return {"overlap": float(overlap.mean()), "auc": float(auc.mean()) if auc.numel() else float("nan"),
            "rows": int(s.shape[0])}
