"""The order the arms of a group run in for each prompt (pure): a seeded, rotating order.

Sample index ``s`` (repeat r of prompt i is ``s = r * prompts + i``) is one block of a
randomised complete block design. Blocks come in cycles of ``arms`` consecutive indices: each
cycle shuffles the arms with a generator seeded by (group seed, cycle), and block ``s`` runs
that shuffle rotated by ``s mod arms``. So over a cycle every arm runs in every position
exactly once (a Latin square: first equally often, last equally often), and which arm follows
which changes from cycle to cycle; the order is a function of (seed, s) alone, so a shard, a
retry or a resume runs its blocks as the whole group would.
"""

from __future__ import annotations

import random


def arm_order(arms: int, seed: int, block: int) -> tuple[int, ...]:
    """Return the positions ``0..arms-1`` in the order they run in block ``block``."""
    if arms < 1:
        raise ValueError(f"a block needs at least one arm, got {arms}")
    cycle, shift = divmod(block, arms)
    order = list(range(arms))
    random.Random(seed * 1_000_003 + cycle).shuffle(order)
    return tuple(order[shift:] + order[:shift])
