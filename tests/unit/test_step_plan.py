"""The step plan: timings of each weight layout at each block size in, a layout per size and the
one-token padding choice out (pure)."""

from __future__ import annotations

import pytest

from workers.step_plan import StepPlan, choose_layout, choose_step_plan, prefers_padding

# The SmolLM2 figures on a 2-core VM (ms): packed 33.7 / 38.1 / 32.4 for 1 / 2 / 4
# tokens, unpacked 26.5 / 26.5 / 36.3.
SMOL = {"packed": {1: 33.7, 2: 38.1, 4: 32.4}, "unpacked": {1: 26.5, 2: 26.5, 4: 36.3}}


def test_each_size_runs_on_its_fastest_layout_and_the_ar_step_on_the_fastest() -> None:
    plan = choose_step_plan(SMOL)
    assert plan == StepPlan(((1, "unpacked"), (4, "packed")), padded=False)
    assert [plan.layout(n) for n in (1, 2, 3, 4, 9)] == [
        "unpacked",
        "unpacked",
        "unpacked",
        "packed",
        "packed",
    ]


def test_the_packed_layout_is_left_only_for_a_clear_gain() -> None:
    assert choose_layout({"packed": 10.0, "unpacked": 9.4}) == "unpacked"
    assert choose_layout({"packed": 10.0, "unpacked": 9.6}) == "packed"
    assert choose_layout({"unpacked": 50.0}) == "unpacked"  # nothing packs (GPU, half precision)
    assert choose_layout({"packed": 5.0}) == "packed"


def test_compiled_and_unpacked_compute_the_same_bits_so_the_faster_is_taken() -> None:
    # "compiled" is the unpacked forward through torch.compile (workers.compiled_step): between
    # the two the faster wins outright; against "packed" the faster of them needs the margin.
    assert choose_layout({"packed": 10.0, "unpacked": 9.4, "compiled": 9.0}) == "compiled"
    assert choose_layout({"packed": 10.0, "unpacked": 9.0, "compiled": 9.3}) == "unpacked"
    assert choose_layout({"packed": 10.0, "unpacked": 9.7, "compiled": 9.6}) == "packed"
    assert choose_layout({"unpacked": 9.0, "compiled": 8.99}) == "compiled"
    seconds = {
        "packed": {1: 33.7, 2: 38.1, 4: 32.4},
        "unpacked": {1: 26.5, 2: 26.5, 4: 36.3},
        "compiled": {1: 24.0, 2: 27.0, 4: 30.0},
    }
    assert choose_step_plan(seconds) == StepPlan(
        ((1, "compiled"), (2, "unpacked"), (4, "compiled")), padded=False
    )


def test_padding_compares_the_chosen_step_with_the_chosen_two_token_block() -> None:
    # Unpacked one-token steps (20) beat packed ones (30); the packed two-token block (15)
    # beats both by more than the padding margin, so steps are padded on the packed layout.
    seconds = {"packed": {1: 30.0, 2: 15.0}, "unpacked": {1: 20.0, 2: 25.0}}
    plan = choose_step_plan(seconds)
    assert plan == StepPlan(((1, "unpacked"), (2, "packed")), padded=True)
    only_unpacked = choose_step_plan({"unpacked": {1: 20.0, 2: 25.0}})
    assert only_unpacked == StepPlan.uniform("unpacked", padded=False)


def test_sizes_with_an_unchanged_layout_are_merged() -> None:
    seconds = {"packed": {1: 1.0, 2: 1.0, 3: 1.0}, "unpacked": {1: 2.0, 2: 2.0, 3: 2.0}}
    assert choose_step_plan(seconds) == StepPlan.uniform("packed")


@pytest.mark.parametrize(
    "seconds",
    [{}, {"packed": {2: 1.0}}, {"packed": {1: 1.0, 2: 1.0}, "unpacked": {1: 1.0}}],
)
def test_timings_must_cover_size_one_at_the_same_sizes_for_every_layout(seconds) -> None:
    with pytest.raises(ValueError, match="same block sizes"):
        choose_step_plan(seconds)


@pytest.mark.parametrize(
    "layouts,message",
    [
        ((), "start at size 1"),
        (((2, "packed"),), "start at size 1"),
        (((1, "packed"), (1, "unpacked")), "increase"),
        (((1, "blocked"),), "unknown layouts"),
    ],
)
def test_a_malformed_plan_names_its_field(layouts, message) -> None:
    with pytest.raises(ValueError, match=f"StepPlan.layouts.*{message}|{message}"):
        StepPlan(layouts)


@pytest.mark.parametrize(
    "one,two,padded",
    [(37.1, 19.1, True), (10.0, 8.9, True), (10.0, 9.1, False), (22.7, 26.1, False)],
)
def test_padding_needs_a_clear_gain_over_one_token_steps(one, two, padded) -> None:
    assert prefers_padding(one, two) == padded
