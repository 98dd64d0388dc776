"""Joining two sets of teacher-forced sequences: every sequence keeps its tokens, features,
validity and choices; the padding between them is invalid, so the loss never reads it."""

from __future__ import annotations

import pytest
import torch

from training.eagle_training import EagleStage, SequenceFeatures
from training.lm_trainer import TrainConfig


def _features(rows: int, width: int, dim: int, seed: int, layers: bool = False):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (rows, width), generator=generator)
    valid = torch.rand(rows, width, generator=generator) > 0.2
    stacked = torch.randn(rows, width, 2 * dim, generator=generator) if layers else None
    return SequenceFeatures(
        tokens,
        torch.randn(rows, width, dim, generator=generator),
        valid,
        torch.randint(0, 50, (rows, width), generator=generator),
        stacked,
    )


@pytest.mark.parametrize("layers", [False, True])
def test_joined_sequences_keep_each_part_and_pad_the_narrower_invalid(layers):
    wide, narrow = _features(3, 7, 4, 0, layers), _features(2, 5, 4, 1, layers)
    for first, second in ((wide, narrow), (narrow, wide)):
        joined = first.joined(second)
        assert joined.tokens.shape == (5, 7) and joined.features.shape == (5, 7, 4)
        assert joined.n_tokens == first.n_tokens + second.n_tokens
        for part, rows in (
            (first, slice(0, first.tokens.shape[0])),
            (second, slice(first.tokens.shape[0], 5)),
        ):
            width = part.tokens.shape[1]
            for name in ("tokens", "features", "valid", "choices", "layers"):
                mine = getattr(part, name)
                if mine is None:
                    assert getattr(joined, name) is None
                    continue
                assert torch.equal(getattr(joined, name)[rows, :width], mine)
            assert not joined.valid[rows, width:].any()


def test_joining_sequences_with_and_without_layer_states_is_refused():
    with pytest.raises(ValueError, match="fused layers"):
        _features(2, 4, 3, 0, layers=True).joined(_features(2, 4, 3, 1))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("code_windows", -1, "code_windows"),
        ("code_window", 1, "code_window"),
        ("agreement_prompts", 0, "agreement_prompts"),
        ("agreement_tokens", 2, "agreement_tokens"),
        ("answer_prompts", -1, "answer_prompts"),
        ("head_vocab", 1, "head_vocab"),
    ],
)
def test_a_stage_refuses_data_and_checks_it_cannot_have(field, value, message):
    training = TrainConfig(steps=1, batch_size=1, lr=1e-3)
    with pytest.raises(ValueError, match=message):
        EagleStage(training=training, **{field: value})
