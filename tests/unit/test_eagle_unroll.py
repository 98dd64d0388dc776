"""EAGLE-3's training-time test: the head's unrolled forward drafts steps 2..k in training as
``EagleStep`` drafts them at inference, and the loss counts each step with its decay."""

from __future__ import annotations

import math

import pytest
import torch
from support.eagle_heads import greedy_continuations, untrained_head
from support.tiny_models import VOCAB, build_tiny_pair

from training.eagle_training import (
    STEP_DECAY,
    EagleLossWeights,
    SequenceFeatures,
    agreement_at_steps,
    eagle_loss,
    length_grouped_batches,
    sequence_features,
    train_steps,
)
from training.lm_trainer import TrainConfig, torch_threads
from workers.eagle.head import unrolled_mask
from workers.eagle.step import EagleStep

D = 64
LAYERS = (0, 2)
VARIANTS = {"eagle1": {}, "fused": {"feature_layers": LAYERS}}


@pytest.fixture(scope="module")
def target():
    """The tiny 3-layer target, under one thread for the module's tests."""
    with torch_threads(1):
        yield build_tiny_pair()[1]


def test_an_unrolled_step_sees_the_true_pairs_to_its_start_and_its_own_chain():
    mask = unrolled_mask(3, 3).int().tolist()
    assert mask == [
        [1, 0, 0, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 1],
    ]
    assert unrolled_mask(3, 1).equal(torch.ones(3, 3, dtype=torch.bool).tril())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_first_step_is_the_decoder_layers_teacher_forced_forward(target, variant):
    head = untrained_head(target, **VARIANTS[variant])
    width = D * (len(LAYERS) if variant == "fused" else 1)
    features, tokens = torch.randn(2, 9, width), torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        _, hidden = head.layer_input(head.project(features), tokens)  # the layer's input
        positions = torch.arange(9)[None]
        out = head.transformer(
            hidden, position_ids=positions, position_embeddings=head.rotary(hidden, positions)
        )
        expected = head.finish(out[0] if isinstance(out, tuple) else out)
        got = head(features, tokens)
    assert got.shape == (1, 2, 9, D)
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_unrolled_steps_equal_the_inference_steps_drafting_with_the_true_tokens(target, variant):
    head = untrained_head(target, **VARIANTS[variant])
    width, steps = 8, 3
    features = torch.randn(1, width, D * (len(LAYERS) if variant == "fused" else 1))
    tokens = torch.randint(0, VOCAB, (1, width + steps - 1))
    with torch.no_grad():
        unrolled = head(features, tokens, steps)
    assert unrolled.shape == (steps, 1, width, D)
    step = EagleStep(head)
    for start in range(width):
        step.reset()
        true_pairs = step.project(features[0, : start + 1])
        predicted = step.forward(true_pairs, tokens[0, : start + 1])[-1]
        for j in range(1, steps):
            torch.testing.assert_close(predicted, unrolled[j - 1, 0, start], atol=1e-5, rtol=1e-4)
            predicted = step.forward(predicted[None], tokens[0, start + j : start + j + 1])[-1]
        torch.testing.assert_close(predicted, unrolled[-1, 0, start], atol=1e-5, rtol=1e-4)


def test_a_forward_refuses_tokens_that_do_not_cover_its_steps(target):
    head = untrained_head(target)
    with pytest.raises(ValueError, match="3 steps over 5 positions need 7 tokens a row, got 5"):
        head(torch.randn(1, 5, D), torch.zeros(1, 5, dtype=torch.long), 3)


def test_the_loss_adds_each_unrolled_step_with_its_decay(target):
    tokens = greedy_continuations(target, 4, seed=5)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[0, -3:] = False
    data = sequence_features(target, tokens, valid)
    head = untrained_head(target)
    quiet = EagleLossWeights(noise=0.0)
    with torch.no_grad():
        one = eagle_loss(head, data, quiet, None)
        three = eagle_loss(head, data, EagleLossWeights(noise=0.0, unroll_steps=3), None)
        predicted = head(data.features[:, :-1], torch.cat([tokens[:, 1:], tokens[:, :2]], 1), 3)
    truth, mask = data.features[:, 3:], valid[:, 3:].float()
    log_q = head.kept_logits(predicted[2, :, :-2]).log_softmax(-1)
    probs = head.kept_logits(truth).softmax(-1)
    per_position = quiet.w_token * -(probs * log_q).sum(-1)
    regression = torch.nn.functional.smooth_l1_loss(predicted[2, :, :-2], truth, reduction="none")
    step3 = ((per_position + regression.mean(-1)) * mask).sum() / mask.sum()
    assert 0 < one < three
    with torch.no_grad():
        two = eagle_loss(head, data, EagleLossWeights(noise=0.0, unroll_steps=2), None)
    torch.testing.assert_close(three, two + STEP_DECAY**2 * step3, atol=1e-5, rtol=1e-5)


def test_a_fused_head_trained_at_three_steps_drafts_step_two_better(target):
    tokens = greedy_continuations(target, 48, seed=11)
    data = sequence_features(target, tokens, torch.ones_like(tokens, dtype=torch.bool), 8, LAYERS)
    held = sequence_features(
        target,
        greedy_continuations(target, 12, seed=12),
        torch.ones(12, 19, dtype=torch.bool),
        8,
        LAYERS,
    )
    config = TrainConfig(steps=150, batch_size=8, lr=3e-3, warmup_steps=10, seed=0)
    agreement = {}
    for unroll in (1, 3):
        head = untrained_head(target, seed=1, feature_layers=LAYERS).train()
        train_steps(head, data, config, EagleLossWeights(noise=0.05, unroll_steps=unroll))
        agreement[unroll] = agreement_at_steps(head.eval(), held, 3, steps=3)
    assert agreement[3][1] > agreement[1][1] + 0.2  # step 2 given step 1 (0.93 vs 0.55 here)
    assert agreement[3][0] > agreement[1][0] - 0.1  # step 1 about as good


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_loss_of_a_batch_is_the_same_without_its_trailing_padding(target, variant, monkeypatch):
    head = untrained_head(target, **VARIANTS[variant])
    tokens = torch.randint(0, VOCAB, (3, 14))
    valid = torch.zeros(3, 14, dtype=torch.bool)
    valid[0, :9], valid[1, :6], valid[2, :4] = True, True, True
    data = sequence_features(target, tokens, valid, layers=LAYERS if variant == "fused" else ())
    assert data.trimmed().tokens.shape == (3, 9) and data.tokens.shape == (3, 14)
    assert data.rows(torch.tensor([1, 2])).trimmed().tokens.shape == (2, 6)
    weights = EagleLossWeights(noise=0.0, unroll_steps=2)
    with torch.no_grad():
        trimmed = eagle_loss(head, data, weights, None)
        monkeypatch.setattr(SequenceFeatures, "trimmed", lambda self: self)
        whole = eagle_loss(head, data, weights, None)
    torch.testing.assert_close(trimmed, whole)


def test_length_grouped_batches_cover_the_epoch_once_with_similar_lengths():
    lengths = torch.randint(5, 300, (203,))
    order = torch.randperm(203, generator=torch.Generator().manual_seed(1))
    batches = length_grouped_batches(order, lengths, 8, torch.Generator().manual_seed(2))
    assert len(batches) == 25 and all(batch.numel() == 8 for batch in batches)
    taken = torch.cat(batches)
    assert taken.unique().numel() == 200 and set(taken.tolist()) == set(order[:200].tolist())
    spread = [int(lengths[b].max() - lengths[b].min()) for b in batches]
    random_spread = [int(lengths[b].max() - lengths[b].min()) for b in order[:200].split(8)]
    assert sum(spread) < sum(random_spread) / 4
    again = length_grouped_batches(order, lengths, 8, torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(batches, again, strict=True))


@pytest.mark.parametrize("grouped", [False, True])
def test_fewer_sequences_than_a_batch_train_as_one_batch(target, grouped):
    head = untrained_head(target)
    tokens = torch.randint(0, VOCAB, (3, 10))
    data = sequence_features(target, tokens, torch.ones(3, 10, dtype=torch.bool))
    config = TrainConfig(steps=2, batch_size=8, lr=1e-3)
    losses = train_steps(head, data, config, EagleLossWeights(), length_grouped=grouped)
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_bf16_autocast_trains_in_bfloat16_and_keeps_float32_weights(target):
    tokens = torch.randint(0, VOCAB, (4, 10))
    data = sequence_features(target, tokens, torch.ones(4, 10, dtype=torch.bool))
    config = TrainConfig(steps=3, batch_size=2, lr=1e-3)
    seen: list[torch.dtype] = []
    runs = {}
    for autocast in (False, True):
        torch.manual_seed(0)
        head = untrained_head(target)
        linear = next(m for m in head.modules() if isinstance(m, torch.nn.Linear))
        handle = linear.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
        runs[autocast] = train_steps(head, data, config, EagleLossWeights(), bf16_autocast=autocast)
        handle.remove()
        assert all(p.dtype == torch.float32 for p in head.parameters())
    assert all(math.isfinite(loss) for losses in runs.values() for loss in losses)
    assert torch.bfloat16 in seen and torch.float32 in seen
    assert runs[True] != runs[False]
