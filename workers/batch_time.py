"""Each request's share of a batch's wall time (pure): what total tokens/s divides by.

While k requests decode together, every second of wall time is one k-th of a second of each
one's: :func:`time_shares` splits the time between each pair of consecutive join or leave
events evenly among the requests in the batch then. The shares of a batch queue sum to the
time during which any request was in the batch (the queue's wall time when it never ran
empty), so a trial's total tokens over its summed shares is the queue's throughput, and the
shares stay a sum over prompts that the intervals can leave a prompt out of.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def time_shares(spans: Sequence[tuple[float, float]]) -> list[float]:
    """Return each (joined, left) span's share of the wall time the spans cover.

    Raises ValueError for a span that ends before it starts.
    """
    for joined, left in spans:
        if left < joined:
            raise ValueError(f"a span ends before it starts: ({joined}, {left})")
    edges = sorted({edge for span in spans for edge in span})
    shares = [0.0] * len(spans)
    for start, end in itertools.pairwise(edges):
        inside = [i for i, (joined, left) in enumerate(spans) if joined <= start and end <= left]
        for i in inside:
            shares[i] += (end - start) / len(inside)
    return shares
