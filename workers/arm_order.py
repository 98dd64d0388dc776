"""The order the arms of a group run in for each prompt (pure): seeded, balanced for position
and for which arm runs right after which.

Sample index ``s`` (repeat r of prompt i is ``s = r * prompts + i``) is one block of a
randomised complete block design. Blocks come in cycles of :func:`cycle_length` consecutive
indices, one per row of a Williams design (rows 0, 1, k−1, 2, k−2, … shifted by one per row; for
an odd number of arms the mirrored rows too): over a cycle every arm runs in every position
equally often, and every arm runs right after every other equally often, so neither a position
effect nor the carry-over of one arm into the next (a cache the previous arm left warm or cold)
favours an arm within a cycle. Each cycle relabels the arms and orders its rows with a generator
seeded by (group seed, cycle); the order is a function of (seed, s) alone, so a shard, a retry
or a resume runs its blocks as the whole group would.
"""

from __future__ import annotations

import random


def williams_rows(arms: int) -> list[tuple[int, ...]]:
    """Return the rows of a Williams design for ``arms`` arms (``arms`` rows, twice that when
    odd): each row a running order of 0..arms-1."""
    if arms < 1:
        raise ValueError(f"a block needs at least one arm, got {arms}")
    first, low, high = [0], 1, arms - 1
    while low <= high:
        first.append(low)
        if low != high:
            first.append(high)
        low, high = low + 1, high - 1
    rows = [tuple((arm + shift) % arms for arm in first) for shift in range(arms)]
    if arms % 2:
        rows += [tuple(reversed(row)) for row in rows]
    return rows


def cycle_length(arms: int) -> int:
    """Return how many consecutive blocks make one balanced cycle."""
    return len(williams_rows(arms))


def arm_order(arms: int, seed: int, block: int) -> tuple[int, ...]:
    """Return the positions ``0..arms-1`` in the order they run in block ``block``."""
    rows = williams_rows(arms)
    cycle, place = divmod(block, len(rows))
    rng = random.Random(seed * 1_000_003 + cycle)
    labels = list(range(arms))
    rng.shuffle(labels)
    order = list(range(len(rows)))
    rng.shuffle(order)
    return tuple(labels[arm] for arm in rows[order[place]])
