"""Divergences between target and draft distributions, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.losses import (
    distillation_loss,
    forward_kl,
    forward_kl_per_token,
    masked_mean,
    reverse_kl,
    reverse_kl_per_token,
    target_distribution,
    tvd,
    tvd_per_token,
)


def logits_of(*probabilities: float) -> torch.Tensor:
    """Logits whose softmax is exactly the given distribution (log-probabilities)."""
    return torch.tensor([math.log(p) if p > 0 else -math.inf for p in probabilities])


P_HALF = logits_of(0.5, 0.5)
Q_QUARTER = logits_of(0.25, 0.75)


def test_forward_kl_matches_hand_value() -> None:
    # KL(p‖q) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3)
    assert forward_kl(P_HALF, Q_QUARTER).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)


def test_reverse_kl_matches_hand_value() -> None:
    # KL(q‖p) = 0.25 ln(0.25/0.5) + 0.75 ln(0.75/0.5)
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert reverse_kl(P_HALF, Q_QUARTER).item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.130812, abs=1e-6)


def test_tvd_matches_hand_value() -> None:
    # ½(|0.5 − 0.25| + |0.5 − 0.75|) = 0.25
    assert tvd(P_HALF, Q_QUARTER).item() == pytest.approx(0.25, abs=1e-7)


def test_three_way_distribution() -> None:
    p = logits_of(0.7, 0.2, 0.1)
    q = logits_of(0.2, 0.5, 0.3)
    forward = 0.7 * math.log(0.7 / 0.2) + 0.2 * math.log(0.2 / 0.5) + 0.1 * math.log(0.1 / 0.3)
    reverse = 0.2 * math.log(0.2 / 0.7) + 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.1)
    assert forward_kl(p, q).item() == pytest.approx(forward, abs=1e-6)
    assert reverse_kl(p, q).item() == pytest.approx(reverse, abs=1e-6)
    assert tvd(p, q).item() == pytest.approx(0.5 * (0.5 + 0.3 + 0.2), abs=1e-6)


def test_logit_shift_does_not_matter() -> None:
    shifted = Q_QUARTER + 17.0
    assert forward_kl(P_HALF, shifted).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-5)


def test_temperature_softens_both_distributions() -> None:
    target = torch.tensor([0.0, math.log(3.0)])  # p = (1/4, 3/4) at T = 1
    draft = torch.zeros(2)  # uniform at any temperature
    # At T = 2 the target logits halve: p = (1, √3) / (1 + √3).
    p0 = 1 / (1 + math.sqrt(3))
    p1 = 1 - p0
    expected = p0 * math.log(p0 / 0.5) + p1 * math.log(p1 / 0.5)
    assert forward_kl(target, draft, temperature=2.0).item() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError):
        forward_kl(target, draft, temperature=0.0)


def test_zero_probability_tokens_are_finite_with_finite_gradients() -> None:
    target = logits_of(1.0, 0.0)  # p = (1, 0): a warped (top-k) target
    draft = torch.tensor([0.0, 0.0], requires_grad=True)
    loss = forward_kl(target, draft)
    assert loss.item() == pytest.approx(math.log(2.0), abs=1e-6)
    loss.backward()
    assert torch.isfinite(draft.grad).all()
    # q puts mass where p has none: KL(q‖p) = +inf, reported as a huge finite number.
    assert reverse_kl(target, torch.zeros(2)).item() >= 1e30


def test_reverse_kl_gradients_stay_finite_for_extreme_logits() -> None:
    draft = torch.tensor([[200.0, 0.0, -200.0]], requires_grad=True)  # q underflows to 0
    target = torch.tensor([[1.0, 0.0, 0.5]])
    loss = reverse_kl(target, draft)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(draft.grad).all()
    # q is one-hot on token 0: KL(q‖p) = −log p(0).
    assert loss.item() == pytest.approx(-math.log(torch.softmax(target, -1)[0, 0].item()), abs=1e-5)


def test_forward_kl_gradient_is_q_minus_p() -> None:
    target = torch.tensor([[0.3, -1.2, 2.0, 0.1]])
    draft = torch.tensor([[1.0, 0.5, -0.5, 0.0]], requires_grad=True)
    forward_kl(target, draft).backward()
    expected = torch.softmax(draft.detach(), -1) - torch.softmax(target, -1)
    torch.testing.assert_close(draft.grad, expected, atol=1e-6, rtol=0)


def test_per_token_shapes_and_mask() -> None:
    target = torch.stack([P_HALF, P_HALF, logits_of(0.9, 0.1)]).view(1, 3, 2)
    draft = torch.stack([Q_QUARTER, P_HALF, P_HALF]).view(1, 3, 2)
    per_token = tvd_per_token(target, draft)
    assert per_token.shape == (1, 3)
    torch.testing.assert_close(per_token, torch.tensor([[0.25, 0.0, 0.4]]), atol=1e-6, rtol=0)
    mask = torch.tensor([[True, False, True]])
    assert tvd(target, draft, mask=mask).item() == pytest.approx((0.25 + 0.4) / 2, abs=1e-6)
    weights = torch.tensor([[1.0, 0.0, 3.0]])
    assert tvd(target, draft, mask=weights).item() == pytest.approx((0.25 + 3 * 0.4) / 4, abs=1e-6)


def test_masked_mean_edge_cases() -> None:
    values = torch.tensor([1.0, 2.0, 6.0])
    assert masked_mean(values).item() == pytest.approx(3.0)
    assert masked_mean(values, torch.zeros(3, dtype=torch.bool)).item() == 0.0
    with pytest.raises(ValueError):
        masked_mean(values, torch.ones(2))


def test_dispatch_matches_named_functions() -> None:
    target = torch.tensor([[0.2, 1.0, -0.3], [2.0, 0.0, 0.5]])
    draft = torch.tensor([[0.0, 0.4, 0.1], [0.3, 0.3, 0.3]])
    mask = torch.tensor([1.0, 0.0])
    for kind, function in (("forward_kl", forward_kl), ("reverse_kl", reverse_kl), ("tvd", tvd)):
        torch.testing.assert_close(
            distillation_loss(kind, target, draft, mask=mask), function(target, draft, mask=mask)
        )
    with pytest.raises(ValueError):
        distillation_loss("jsd", target, draft)  # type: ignore[arg-type]


def test_prepared_target_gives_the_same_values() -> None:
    target = torch.tensor([[0.2, 1.0, -0.3], [2.0, 0.0, 0.5]])
    draft = torch.tensor([[0.0, 0.4, 0.1], [0.3, -0.3, 0.9]])
    prepared = target_distribution(target, temperature=1.5)
    for kind in ("forward_kl", "reverse_kl", "tvd"):
        torch.testing.assert_close(
            distillation_loss(kind, prepared, draft, temperature=1.5),
            distillation_loss(kind, target, draft, temperature=1.5),
        )
    with pytest.raises(ValueError):
        forward_kl(prepared, draft)  # prepared at T = 1.5, asked at T = 1


logit_rows = st.lists(
    st.floats(min_value=-8, max_value=8, allow_nan=False), min_size=5, max_size=5
).map(torch.tensor)


@settings(max_examples=60, deadline=None)
@given(logit_rows, logit_rows)
def test_divergence_bounds(target: torch.Tensor, draft: torch.Tensor) -> None:
    forward = forward_kl_per_token(target, draft).item()
    reverse = reverse_kl_per_token(target, draft).item()
    distance = tvd_per_token(target, draft).item()
    assert forward >= -1e-6 and reverse >= -1e-6
    assert -1e-6 <= distance <= 1 + 1e-6
    # Pinsker's inequality holds for both directions; the slack is float32 rounding of a KL near 0.
    assert distance <= math.sqrt(max(forward, 0.0) / 2 + 1e-6)
    assert distance <= math.sqrt(max(reverse, 0.0) / 2 + 1e-6)
    assert forward_kl_per_token(target, target).item() == pytest.approx(0.0, abs=1e-6)
