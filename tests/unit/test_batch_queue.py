"""The continuous-batching queue simulator (costs.batch_queue), the cost table fit on live
queues (costs.batch_costs) and its held-out projection (costs.batch_replay), on hand-made
queues whose costs are known."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.analysis.costs.batch_costs import (
    LiveQueue,
    LiveSequence,
    fit_batch_costs,
    queue_observations,
)
from orchestrator.analysis.costs.batch_queue import simulate_queue
from orchestrator.analysis.costs.batch_replay import fit_batch_group, held_out_batch
from orchestrator.analysis.costs.model import CostModelError
from workers.records import RoundRecord


@dataclass(frozen=True)
class Shape:
    """A round as the queue reads it."""

    drafted: int
    draft_forwards: int


class HandPricing:
    """Prefill 1 s a join; a round: 1 s a row, 0.1 s a draft step, 0.01 s a drafted token."""

    def prefill_seconds(self, rows: int) -> float:
        return 1.0

    def round_seconds(self, rows: int, draft_steps: int, block: int) -> float:
        return rows + 0.1 * draft_steps + 0.01 * block


def test_the_queue_joins_and_leaves_as_the_batch_engine_schedules() -> None:
    # two rows; sequence 1 leaves after one round and sequence 2 takes its row
    sequences = [
        [Shape(2, 2), Shape(3, 3), Shape(1, 1)],
        [Shape(4, 4)],
        [Shape(0, 0), Shape(2, 2)],
    ]
    times = simulate_queue(sequences, 2, HandPricing())
    assert [r.members for r in times.rounds] == [(0, 1), (0, 2), (0, 2)]
    assert [(r.draft_steps, r.block) for r in times.rounds] == [(4, 4), (3, 3), (2, 2)]
    assert [j.members for j in times.joins] == [(0, 1), (2,)]
    # prefill 0–1; round 1 (2 rows, 4 steps, block 4) 1–3.44; join 3.44–4.44; rounds of
    # 2.33 and 2.22 s to 8.99
    assert times.joined == pytest.approx((0.0, 0.0, 3.44))
    assert times.prefilled == pytest.approx((1.0, 1.0, 4.44))
    assert times.left == pytest.approx((8.99, 3.44, 8.99))
    assert times.seconds == pytest.approx((8.99, 3.44, 5.55))
    assert times.wall_seconds == pytest.approx(8.99)
    # 0–3.44 shared by 0 and 1, 3.44–8.99 by 0 and 2
    assert times.batch_seconds == pytest.approx((1.72 + 2.775, 1.72, 2.775))
    assert sum(times.batch_seconds) == pytest.approx(times.wall_seconds)


def test_one_slot_runs_the_sequences_one_after_another() -> None:
    times = simulate_queue([[Shape(1, 1)] * 2, [Shape(1, 1)]], 1, HandPricing())
    assert [r.members for r in times.rounds] == [(0,), (0,), (1,)]
    assert times.joined[1] == pytest.approx(times.left[0])
    with pytest.raises(ValueError, match="slots"):
        simulate_queue([], 0, HandPricing())


class Truth:
    """Known costs: a draft step 10 + 2·rows ms, a verify 50 + 10·rows + 4·block ms, a prefill
    20 ms a joining row, 1 ms a round outside them."""

    def draft(self, rows: int, steps: int) -> float:
        return steps * (0.010 + 0.002 * rows)

    def verify(self, rows: int, block: int) -> float:
        return 0.050 + 0.010 * rows + 0.004 * block

    def prefill_seconds(self, rows: int) -> float:
        return 0.020 * rows

    def round_seconds(self, rows: int, draft_steps: int, block: int) -> float:
        return self.draft(rows, draft_steps) + self.verify(rows, block) + 0.001


def live_queue(
    trial_id: str, sequences: list[list[Shape]], slots: int, ar_offset: float = 0.0
) -> LiveQueue:
    """Return what a live run of ``sequences`` would store when it costs :class:`Truth`, a
    queue that never drafts (the AR baseline's) ``ar_offset`` more a verify."""
    truth = Truth()
    drafts = any(shape.draft_forwards for rounds in sequences for shape in rounds)
    offset = 0.0 if drafts else ar_offset
    times = simulate_queue(sequences, slots, truth)
    records: list[list[RoundRecord]] = [[] for _ in sequences]
    taken = [0] * len(sequences)
    for batch_round in times.rounds:
        rows = len(batch_round.members)
        for index in batch_round.members:
            shape = sequences[index][taken[index]]
            taken[index] += 1
            records[index].append(
                RoundRecord(
                    shape.drafted,
                    0,
                    False,
                    shape.draft_forwards,
                    truth.draft(rows, batch_round.draft_steps),
                    truth.verify(rows, batch_round.block) + offset,
                )
            )
    return LiveQueue(
        trial_id,
        slots,
        tuple(
            LiveSequence(tuple(records[i]), times.prefill_seconds[i], seconds, share)
            for i, (seconds, share) in enumerate(
                zip(times.seconds, times.batch_seconds, strict=True)
            )
        ),
    )


def _static(k: int, lengths: list[int]) -> list[list[Shape]]:
    return [[Shape(k, k)] * n for n in lengths]


#: an AR queue (no drafts) and two static queues (K = 2, K = 4) of unequal lengths, at B = 3
QUEUES = [
    live_queue("ar", _static(0, [6, 4, 5, 6]), 3),
    live_queue("k2", _static(2, [3, 2, 4, 3]), 3),
    live_queue("k4", _static(4, [2, 2, 3, 1]), 3),
]


def test_the_fit_recovers_known_costs_from_live_queues() -> None:
    assert all(queue_observations(q).consistent == 1.0 for q in QUEUES)
    table = fit_batch_costs(3, QUEUES)
    truth = Truth()
    for rows, step in table.draft_step:
        assert step == pytest.approx(truth.draft(rows, 1))
    for rows, block, seconds in table.verify:
        assert seconds == pytest.approx(truth.verify(rows, block))
    assert table.verify_seconds(3, 3) == pytest.approx(truth.verify(3, 3))  # the plane
    assert table.prefill_seconds(2) == pytest.approx(0.040)
    assert table.round_overhead == pytest.approx(0.001)
    assert table.r2_round == pytest.approx(1.0)


def test_a_held_out_check_is_projected_by_the_others() -> None:
    held = held_out_batch(3, QUEUES, "k2")
    assert held.error == pytest.approx(0.0, abs=1e-9)
    assert held.wall_error == pytest.approx(0.0, abs=1e-9)
    assert held.measured_wall == pytest.approx(sum(s.batch_seconds for s in QUEUES[1].sequences))
    group = fit_batch_group(3, QUEUES, {"k2", "k4"})
    assert [c.trial_id for c in group.checks] == ["k2", "k4"]
    assert group.out_of_sample_error == pytest.approx(0.0, abs=1e-9)
    assert group.n_trials == 3


def test_a_check_the_others_cannot_price_has_no_error() -> None:
    # without k2 and k4 only the AR queue is left: no draft step was measured
    held = held_out_batch(3, QUEUES[:2], "k2")
    assert held.error is None and "no draft round" in held.note
    with pytest.raises(CostModelError, match="no live round"):
        fit_batch_costs(3, [])


def test_the_ar_baselines_own_path_does_not_leak_into_the_speculative_table() -> None:
    # the AR queue's verify costs 20 ms more (its own path); the K = 4 queue's last rounds draft
    # one token, so the speculative rounds alone vary the block
    tailed = [[Shape(4, 4)] * (n - 1) + [Shape(1, 1)] for n in (2, 2, 3, 1)]
    queues = [
        live_queue("ar", _static(0, [6, 4, 5, 6]), 3, ar_offset=0.020),
        live_queue("k2", _static(2, [3, 2, 4, 3]), 3),
        live_queue("k4", tailed, 3),
    ]
    table = fit_batch_costs(3, queues)
    assert table.verify_seconds(3, 3) == pytest.approx(Truth().verify(3, 3))
    assert held_out_batch(3, queues, "k2").error == pytest.approx(0.0, abs=1e-9)
