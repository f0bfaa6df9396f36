"""The cache's keep rule (:func:`foresight.views.kept_entries`): against a per-row reference, and alike on one layer,
on stacked layers and on the layers folded into the batch (the learned policy's compiled events run it in one graph
with the scores)."""

from __future__ import annotations

import torch

from foresight.sampling import top_keep
from foresight.views import EvictLayersView, kept_entries

L, BATCH, HKV, N, C, KEEP, SINKS = 3, 2, 2, 14, 10, 6, 2


def _view(protect_len):
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(L, BATCH, HKV, N, 4, generator=gen)
    positions = torch.arange(N).expand(L, BATCH, HKV, N).clone()
    valid = torch.ones(L, BATCH, HKV, N, dtype=torch.bool)
    valid[:, 1, :, :3] = False  # row 1: three padded entries first
    return EvictLayersView(layers=range(L), keys=keys, values=keys, positions=positions, valid=valid,
                           num_candidates=C, num_keep=KEEP, event=0, step=0, sinks=SINKS, protect_len=protect_len)


def _select(scores, num_keep, view):
    return top_keep(scores, num_keep)


def _reference(scores, valid, positions, protect):
    """Per row, in plain Python: padding never kept, sinks and the protected prompt always, then the highest scores
    (the older of ties), then the newest ``N - C``."""
    s, v, p = scores.tolist(), valid.tolist(), positions.tolist()
    must = [i for i in range(C) if v[i] and p[i] < max(SINKS, protect)]
    rest = sorted((i for i in range(C) if v[i] and i not in must), key=lambda i: (-s[i], i))
    pads = [i for i in range(C) if not v[i]]
    chosen = (must + rest + pads)[:KEEP]
    return sorted(chosen) + list(range(C, N))


def test_kept_entries_equal_a_per_row_reference_and_agree_folded():
    protect_len = torch.tensor([4, 0])
    view = _view(protect_len)
    scores = torch.randn(L, BATCH, HKV, C, generator=torch.Generator().manual_seed(1))
    scores[0, 0, 0, 5] = scores[0, 0, 0, 6]  # a tie
    got = kept_entries(view, scores, _select)
    assert got.shape == (L, BATCH, HKV, KEEP + N - C)
    for li in range(L):
        for b in range(BATCH):
            for h in range(HKV):
                want = _reference(scores[li, b, h], view.valid[li, b, h, :C], view.positions[li, b, h, :C],
                                  int(protect_len[b]))
                assert got[li, b, h].tolist() == want, (li, b, h)
        assert torch.equal(kept_entries(view.layer(li), scores[li], _select), got[li])
    folded = view.folded()
    assert torch.equal(folded.protect_len, protect_len.repeat(L))
    assert torch.equal(kept_entries(folded, scores.flatten(0, 1), _select), got.flatten(0, 1))


def test_padding_goes_first_even_when_its_scores_are_highest():
    view = _view(None).layer(0)
    scores = torch.zeros(BATCH, HKV, C)
    scores[1, :, :3] = 100.0  # row 1's padding
    got = kept_entries(view, scores, _select)
    assert not set(range(3)) & set(got[1, 0].tolist())
    assert set(range(SINKS)) <= set(got[0, 0].tolist())  # the sinks of row 0 stay at equal scores
