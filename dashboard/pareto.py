"""Pareto fronts of points, each axis maximised or minimised (pure).

A point dominates another when it is at least as good on every axis and strictly better on at
least one. The front is the set of points no other point dominates, so equal points are either
all on the front or all off it. Points with a NaN coordinate are never on the front and never
dominate anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Points = Sequence[Sequence[float]] | np.ndarray


def pareto_front(points: Points, maximise: Sequence[bool]) -> list[int]:
    """Return the indices of the non-dominated points, in input order.

    ``maximise[k]`` says whether larger is better on axis k (False: smaller is better). Exists
    so a policy's threshold sweep can be drawn as the frontier of its best trade-offs.
    """
    directions = np.asarray(maximise, dtype=bool)
    values = np.asarray(points, dtype=float).reshape(-1, len(directions))
    if len(values) == 0:
        return []
    scores = np.where(directions, values, -values)
    valid = ~np.isnan(scores).any(axis=1)
    front = []
    for index in np.flatnonzero(valid):
        others = scores[valid]
        at_least_as_good = (others >= scores[index]).all(axis=1)
        strictly_better = (others > scores[index]).any(axis=1)
        if not (at_least_as_good & strictly_better).any():
            front.append(int(index))
    return front


def pareto_mask(points: Points, maximise: Sequence[bool]) -> list[bool]:
    """Return one flag per point: True when it is on the Pareto front (see :func:`pareto_front`)."""
    values = np.asarray(points, dtype=float).reshape(-1, len(maximise))
    on_front = set(pareto_front(values, maximise))
    return [index in on_front for index in range(len(values))]
