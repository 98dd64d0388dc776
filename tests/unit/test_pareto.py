"""Pareto fronts against hand-computed fronts, and a brute-force check on random points."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.pareto import pareto_front, pareto_mask

SPREAD = [(1.0, 1.0), (2.0, 0.0), (0.0, 2.0), (1.0, 1.5), (0.5, 0.5)]


def test_empty_input_has_empty_front() -> None:
    assert pareto_front([], [True, True]) == []
    assert pareto_mask([], [True, False]) == []


def test_one_point_is_its_own_front() -> None:
    assert pareto_front([(3.0, -1.0)], [True, True]) == [0]
    assert pareto_front([(3.0, -1.0)], [False, False]) == [0]


def test_max_max_front() -> None:
    # (1, 1) is beaten by (1, 1.5); (0.5, 0.5) by (1, 1); the other three trade off.
    assert pareto_front(SPREAD, [True, True]) == [1, 2, 3]


def test_min_min_front() -> None:
    # Lower is better: (0.5, 0.5) beats (1, 1) and (1, 1.5); (2, 0) and (0, 2) are extremes.
    assert pareto_front(SPREAD, [False, False]) == [1, 2, 4]


def test_min_x_max_y_front() -> None:
    # Fewer drafted tokens (x) and more speedup (y): (3, 1.8) and (2, 1.9) lose to (2, 2).
    points = [(1.0, 1.5), (2.0, 2.0), (3.0, 1.8), (2.0, 1.9)]
    assert pareto_front(points, [False, True]) == [0, 1]
    assert pareto_mask(points, [False, True]) == [True, True, False, False]


def test_identical_points_share_the_front() -> None:
    assert pareto_front([(1.0, 1.0), (1.0, 1.0), (0.0, 0.0)], [True, True]) == [0, 1]
    assert pareto_front([(1.0, 1.0), (1.0, 1.0), (0.0, 0.0)], [False, False]) == [2]


def test_a_tie_on_one_axis_is_decided_by_the_other() -> None:
    assert pareto_front([(1.0, 2.0), (1.0, 1.0)], [True, True]) == [0]
    assert pareto_front([(1.0, 2.0), (1.0, 1.0)], [True, False]) == [1]


def test_nan_points_are_left_out() -> None:
    assert pareto_front([(math.nan, 9.0), (1.0, 1.0), (0.0, math.nan)], [True, True]) == [1]


def test_three_axes() -> None:
    points = [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.0, 0.0, 0.0)]
    assert pareto_front(points, [True, True, True]) == [0, 1, 2]
    assert pareto_front(points, [False, False, False]) == [3]


def _dominates(a: tuple[int, int], b: tuple[int, int], maximise: tuple[bool, bool]) -> bool:
    """Brute-force dominance, written independently of the implementation."""
    triples = list(zip(a, b, maximise, strict=True))
    better_or_equal = all((x >= y) if up else (x <= y) for x, y, up in triples)
    strictly = any((x > y) if up else (x < y) for x, y, up in triples)
    return better_or_equal and strictly


@settings(max_examples=60, deadline=None)
@given(
    points=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=12),
    maximise=st.tuples(st.booleans(), st.booleans()),
)
def test_front_is_exactly_the_undominated_points(points, maximise) -> None:
    expected = [
        i
        for i, point in enumerate(points)
        if not any(_dominates(other, point, maximise) for other in points)
    ]
    assert pareto_front(points, list(maximise)) == expected
