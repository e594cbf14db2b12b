"""``./dev bench plan``'s arithmetic: Spearman's rank correlation, the pairs every round ordered, the spread of
measured candidates."""

import pytest

from benchmarks.plan import pair_orders, spearman, spread


def test_spearman_orders_ties_and_reversals():
    assert spearman([1, 2, 3, 4, 5], [10, 20, 30, 40, 50]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swap among five: 1 - 6 * 2 / (5 * 24) = 0.9
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)  # average ranks for the tie


def test_spread_keeps_the_pick_first_and_the_worst_last():
    ranked = list(range(20))
    picked = spread(ranked, 6)
    assert picked[0] == 0 and picked[-1] == 19 and len(set(picked)) == 6
    assert spread(ranked[:4], 6) == [0, 1, 2, 3]


def test_a_pair_counts_only_when_every_round_orders_it_the_same_way():
    predicted = [3.0, 2.0, 1.0]
    rounds = [[10, 11, 12],  # a: above b and c in every round
              [9, 12, 8],    # b: against c the rounds agree (above), against a they disagree
              [5, 6, 7]]
    assert pair_orders(predicted, rounds) == (2, 0, 1)  # a>c and b>c as predicted; a-b within noise
    assert pair_orders([1.0, 2.0, 3.0], rounds) == (0, 2, 1)  # the same measurements against the reverse order
    assert pair_orders([1.0, 1.0], [[1, 2], [2, 1]]) == (0, 0, 1)  # a predicted tie orders nothing
