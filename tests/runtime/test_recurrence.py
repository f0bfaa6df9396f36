"""The recurrence update (LazyEviction's ``last``/``mri``, shared by ``lazy`` and the ``recency`` features) against
plain Python, on both of its code paths (one scan over the rows, rows one at a time)."""

from __future__ import annotations

import pytest
import torch

from foresight import recurrence


def naive(last, mri, act, steps):
    """last, mri (E, n); act (E, q, n); steps (E, q): rows in order, entry by entry."""
    last, mri = last.clone(), mri.clone()
    for e in range(act.shape[0]):
        for i in range(act.shape[1]):
            for j in range(act.shape[2]):
                if act[e, i, j]:
                    mri[e, j] = max(int(mri[e, j]), int(steps[e, i]) - int(last[e, j]))
                    last[e, j] = int(steps[e, i])
    return last, mri


@pytest.mark.parametrize("q", [1, 5, 16])
@pytest.mark.parametrize("row_loop", [False, True])
def test_activate_equals_rows_in_order(monkeypatch, q, row_loop):
    monkeypatch.setattr(recurrence, "ROW_LOOP_MIN", 1 if row_loop else 10**9)
    g = torch.Generator().manual_seed(q)
    b, h, n = 2, 3, 11
    act = torch.rand(b, h, q, n, generator=g) < 0.35
    start = torch.tensor([40, 57])  # rows of a batch at their own positions
    steps = (start[:, None] + torch.arange(q)).long()  # (b, q)
    last = torch.randint(0, 40, (b, h, n), generator=g)
    mri = torch.randint(0, 6, (b, h, n), generator=g)
    want = naive(last.view(b * h, n), mri.view(b * h, n), act.view(b * h, q, n),
                 steps[:, None, :].expand(b, h, q).reshape(b * h, q))
    recurrence.activate(last, mri, act, steps[:, None, :, None])
    assert torch.equal(last.view(b * h, n), want[0]) and torch.equal(mri.view(b * h, n), want[1])
    assert (want[1] > mri.new_tensor(0)).any()  # something recurred
