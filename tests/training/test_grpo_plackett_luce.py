"""Plackett–Luce log-probabilities against brute-force enumeration, and Gumbel-top-k sampling statistics."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from foresight.sampling import gumbel_topk, log_prob, step_log_probs


def brute_force(logits: list[float], order: tuple[int, ...], free: list[bool]) -> float:
    """p(order) by the definition: product of softmax probabilities over the items left at each draw."""
    left = [i for i, f in enumerate(free) if f]
    p = 1.0
    for j in order:
        z = sum(math.exp(logits[i]) for i in left)
        p *= math.exp(logits[j]) / z
        left.remove(j)
    return p


@pytest.mark.parametrize("c,k", [(4, 1), (5, 2), (5, 3), (6, 6), (6, 4)])
def test_log_prob_matches_enumeration(c, k):
    gen = torch.Generator().manual_seed(c * 10 + k)
    logits = torch.randn(c, generator=gen, dtype=torch.float64) * 2
    free = [True] * c
    if c - 1 >= k:  # one non-drawable item (a protected sink) where the draw still fits
        free[c // 2] = False
    mask = torch.tensor(free)
    items = [i for i in range(c) if free[i]]
    orders = list(itertools.permutations(items, k))
    lp = log_prob(logits.expand(len(orders), c), torch.tensor(orders), mask.expand(len(orders), c))
    ref = torch.tensor([math.log(brute_force(logits.tolist(), o, free)) for o in orders], dtype=torch.float64)
    torch.testing.assert_close(lp.double(), ref, atol=1e-5, rtol=1e-5)
    # a distribution over ordered draws: probabilities sum to one
    assert abs(lp.double().exp().sum().item() - 1.0) < 1e-5
    # the explicit per-step reference agrees
    torch.testing.assert_close(step_log_probs(logits.expand(len(orders), c), torch.tensor(orders),
                                              mask.expand(len(orders), c)).sum(-1), lp, atol=1e-5, rtol=1e-5)


def test_set_probability_is_sum_over_orderings():
    """The unordered-set probability (sum over its k! orderings) also sums to one over all k-subsets."""
    logits = torch.tensor([0.3, -1.0, 2.0, 0.5, -0.2], dtype=torch.float64)
    total = 0.0
    for subset in itertools.combinations(range(5), 3):
        orders = torch.tensor(list(itertools.permutations(subset)))
        total += log_prob(logits.expand(len(orders), 5), orders).double().exp().sum().item()
    assert abs(total - 1.0) < 1e-5


def test_log_prob_batched_shapes_and_gradient():
    """(batch, layers, heads, C) logits with masks; gradients finite even when every free item is drawn."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 7, generator=gen, requires_grad=True)
    mask = torch.ones(2, 3, 4, 7, dtype=torch.bool)
    mask[0, 0, 0, 3:] = False  # exactly k=3 drawable items in this row
    order = gumbel_topk(logits, 3, mask, generator=gen)
    assert order.shape == (2, 3, 4, 3)
    assert bool(mask.gather(-1, order).all())
    lp = log_prob(logits, order, mask)
    assert lp.shape == (2, 3, 4)
    assert lp[0, 0, 0].item() <= 0
    lp.sum().backward()
    assert bool(torch.isfinite(logits.grad).all())
    # gradient of log p wrt logits matches the per-step reference
    g1 = logits.grad.clone()
    logits.grad = None
    step_log_probs(logits, order, mask).sum().backward()
    torch.testing.assert_close(logits.grad, g1, atol=1e-5, rtol=1e-5)


def test_gumbel_topk_frequencies_match_probabilities():
    """Empirical frequencies of the 12 ordered draws of 2 from 4 items vs exact PL probabilities (chi-square)."""
    from scipy.stats import chisquare

    logits = torch.tensor([1.0, 0.0, -0.5, 0.7])
    n = 40000
    draws = gumbel_topk(logits.expand(n, 4), 2, generator=torch.Generator().manual_seed(123))
    outcomes = list(itertools.permutations(range(4), 2))
    index = {o: i for i, o in enumerate(outcomes)}
    counts = torch.zeros(len(outcomes))
    for a, b in draws.tolist():
        counts[index[(a, b)]] += 1
    probs = log_prob(logits.expand(len(outcomes), 4), torch.tensor(outcomes)).exp()
    assert abs(probs.sum().item() - 1) < 1e-5
    stat = chisquare(counts.numpy(), (probs * n).numpy())
    assert stat.pvalue > 1e-3, (counts / n, probs)
    # and a clearly wrong distribution (uniform) is rejected by the same test
    assert chisquare(counts.numpy(), [n / len(outcomes)] * len(outcomes)).pvalue < 1e-6


def test_gumbel_topk_respects_mask_and_seed():
    logits = torch.zeros(500, 6)
    mask = torch.tensor([True, False, True, True, False, True]).expand(500, 6)
    a = gumbel_topk(logits, 4, mask, generator=torch.Generator().manual_seed(1))
    b = gumbel_topk(logits, 4, mask, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert not bool(((a == 1) | (a == 4)).any())
    assert bool((a.sort(-1).values == torch.tensor([0, 2, 3, 5])).all())  # all 4 drawable items drawn
    with pytest.raises(ValueError):
        gumbel_topk(logits, 5, mask)
