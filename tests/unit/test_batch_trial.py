"""A group shard at a batch size above 1 (``workers.batch_trial``): each arm decodes its
prompts as one batch queue, greedy outputs equal batch 1's, each result carries its timing
split and its share of the batch's wall time; the draft side's view of the target's batched
cache (``ChannelBatchedLM``) gives what the cache itself gives."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts

from workers.batch_target import BatchTarget, ChannelBatchedLM
from workers.batch_trial import decode_queue, run_group
from workers.lm import CachedLM
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.trial import ArmRequest, GroupRequest, TrialRequest

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair() -> tuple[CachedLM, LocalTarget]:
    """The tiny in-memory pair: the draft, and the target as a worker holds it."""
    draft, target = build_tiny_pair()
    return CachedLM(draft), LocalTarget(CachedLM(target))


def _group(batch_size: int, policies: tuple[str, ...] = ("ar", "static")) -> GroupRequest:
    """Six prompts of 3–12 tokens, each arm greedy with 10 new tokens, at ``batch_size``."""
    token_ids = [prompt.tolist() for prompt in prompts(6, seed=2)]
    arms = tuple(
        ArmRequest(
            f"{policy}-{batch_size}",
            TrialRequest(
                prompts=token_ids,
                sampling=SamplingConfig(max_new_tokens=10),
                policy=policy,
                max_draft_len=0 if policy == "ar" else 3,
                seed=5,
                indices=tuple(range(6)),
                batch_size=batch_size,
            ),
        )
        for policy in policies
    )
    return GroupRequest(arms, seed=1)


def test_greedy_outputs_at_batch_three_equal_batch_one(pair) -> None:
    draft, target = pair
    alone, together = run_group(draft, target, _group(1)), run_group(draft, target, _group(3))
    assert not alone.errors and not together.errors
    for policy in ("ar", "static"):
        one = [r.output_ids for r in alone.results[f"{policy}-1"]]
        three = [r.output_ids for r in together.results[f"{policy}-3"]]
        assert three == one, policy
    assert {sample.index for sample in together.log} == set(range(6))
    assert [r.batch_seconds for r in alone.results["ar-1"]] == [None] * 6


def test_each_result_has_its_split_and_its_share_of_the_queue(pair) -> None:
    draft, target = pair
    done = run_group(draft, target, _group(3))
    for key, results in done.results.items():
        for result in results:
            assert result.prefill_seconds is not None and result.decode_seconds is not None
            assert result.prefill_seconds + result.decode_seconds == pytest.approx(result.seconds)
            assert result.batch_seconds is not None
            assert 0 < result.batch_seconds <= result.seconds, key
        # the shares add up to the time the queue had a row busy, within the arm's wall time
        ((started, ended),) = {(s.started, s.ended) for s in done.log if s.key == key}
        assert sum(r.batch_seconds for r in results) <= ended - started + 1e-3


def test_an_arm_that_cannot_batch_stops_alone(pair) -> None:
    draft, target = pair
    group = _group(2, ("ar", "static", "no_such_policy"))
    done = run_group(draft, target, group)
    assert set(done.results) == {"ar-2", "static-2"}
    assert set(done.errors) == {"no_such_policy-2"}


def test_mixed_batch_sizes_in_one_shard_are_refused(pair) -> None:
    draft, target = pair
    arms = _group(1).arms[:1] + _group(2).arms[1:]
    with pytest.raises(ValueError, match="share one batch size"):
        run_group(draft, target, GroupRequest(arms, seed=0))


def test_the_channel_view_of_the_target_cache_decodes_as_the_cache(pair) -> None:
    draft, target = pair
    side = BatchTarget(target.lm)

    class Remote:
        """The target side behind a call, as a channel reaches it (no socket here)."""

        def batched(self, slots: int) -> ChannelBatchedLM:
            return ChannelBatchedLM(lambda method, *args: getattr(side, method)(*args), slots)

        def batch_generate(self, requests, slots):
            return side.batch_generate(requests, slots)

    request = _group(3).arms[1].request
    direct = decode_queue(draft, side, request)
    remote = decode_queue(draft, Remote(), request)
    assert [r.output_ids for r in remote] == [r.output_ids for r in direct]
    assert sum(r.n_accepted for r in remote) > 0
