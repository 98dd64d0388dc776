"""The zoo's EAGLE stage on a tiny target and hand-made teacher samples: it trains, measures
and saves a head that loads by path; smol's and smol-base's recipe hashes are unchanged."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts

from training.eagle_training import EagleStage
from training.lm_trainer import TrainConfig, torch_threads
from training.pretrained_drafts import DraftVocab, EvalRecipe, TeacherSample
from training.zoo.eagle_stage import (
    EagleData,
    EagleEvaluation,
    code_windows,
    eagle_into,
    sample_features,
)
from training.zoo.pretrained import eagle_head_vocab
from training.zoo.recipes import PROFILES, SMOL_EAGLE_RECIPE
from workers.corpus import code_training_text
from workers.eagle.artifact import load_eagle_head
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget


def _samples(target, n: int) -> list[TeacherSample]:
    """Return ``n`` greedy target responses to random prompts as teacher samples."""
    local = LocalTarget(CachedLM(target, single_step="plain"))
    greedy = RequestSettings(sampling=SamplingConfig(temperature=0.0, max_new_tokens=12))
    found = []
    for prompt in prompts(n, seed=21):
        response = local.generate(prompt, greedy).output_ids
        ids = torch.cat([prompt, torch.tensor(response)])
        start = prompt.numel() - 1
        top = torch.zeros(len(response), 1, dtype=torch.long)
        found.append(TeacherSample(ids, start, top, top.float()))
    return found


def test_features_of_padded_samples_are_those_of_each_sample_alone():
    target = build_tiny_pair()[1]
    samples = _samples(target, 3)
    data, prompt_lengths = sample_features(target, samples, batch_size=2, pad_id=0)
    for row, sample in enumerate(samples):
        n = sample.ids.numel()
        alone = target.model(input_ids=sample.ids[None]).last_hidden_state[0]
        torch.testing.assert_close(data.features[row, :n], alone, atol=1e-5, rtol=1e-4)
        assert int(data.valid[row].sum()) == n
        assert prompt_lengths[row] == sample.start + 1


def test_samples_that_kept_their_features_are_not_run_through_the_target_again():
    target = build_tiny_pair()[1]
    samples = _samples(target, 3)
    kept = [
        replace(sample, features=torch.full((sample.ids.numel() - 1, 64), float(index)))
        for index, sample in enumerate(samples)
    ]
    data, prompt_lengths = sample_features(target, kept, batch_size=2, pad_id=0)
    for row, sample in enumerate(kept):
        n = sample.ids.numel()
        assert torch.equal(data.features[row, : n - 1], sample.features)
        assert torch.equal(data.tokens[row, :n], sample.ids)
        assert int(data.valid[row].sum()) == n - 1
        assert prompt_lengths[row] == sample.start + 1
    mixed, _ = sample_features(target, kept[:2] + samples[2:], batch_size=2, pad_id=0)
    alone = target.model(input_ids=samples[0].ids[None]).last_hidden_state[0]
    torch.testing.assert_close(mixed.features[0, : alone.shape[0]], alone, atol=1e-5, rtol=1e-4)


def test_stage_trains_measures_and_saves_a_loadable_head(tmp_path):
    target = build_tiny_pair()[1]
    samples = _samples(target, 40)
    stage = EagleStage(training=TrainConfig(steps=60, batch_size=8, lr=3e-3, warmup_steps=5))
    vocab = DraftVocab.of(torch.arange(0, 96, 2), 96)
    eval_recipe = EvalRecipe(new_tokens=12, timing_context=16)
    evaluation = EagleEvaluation(eval_recipe, prompts(2, seed=4), prompts(3, seed=5), "tiny", None)
    code = [torch.randint(0, 96, (20,)) for _ in range(4)]
    with torch_threads(1):
        eagle_into(
            SMOL_EAGLE_RECIPE,
            replace(stage, agreement_tokens=10),
            target,
            EagleData(samples[:32], samples[32:], code),
            vocab,
            evaluation,
            tmp_path,
            progress=False,
        )
    card = json.loads((tmp_path / "eagle" / "model_card.json").read_text())
    assert card["ref"] == "zoo:smol-eagle/eagle" and card["head_vocab"] == 48
    assert card["heldout_agreement"][0] > card["heldout_agreement_before"][0]
    assert card["training"]["code_windows"] == 4
    answers = card["answer_agreement"]
    assert answers["prompts"] == 3 and answers["after"][0] > answers["before"][0]
    static = card["realism"]["static"]
    assert set(static) == {"2", "4"} and all(s["matches_target"] for s in static.values())
    assert card["realism"]["costs"]["prepacked"]["t_head_s"] > 0
    head = load_eagle_head(tmp_path / "eagle", target)
    assert head.config.head_vocab == tuple(range(0, 96, 2))


def test_profiles_without_an_eagle_head_keep_their_hashes():
    """The cache folders of smol-base and smol-exit (and the results recorded with them) stay.

    smol's hash changed on purpose twice: when it stopped distilling the early exit
    (453446866a87 before; that recipe is smol-exit's now, under its own name) and when the
    demo's EAGLE head joined it (cb8027b77d18 before: the same target and draft-s)."""
    assert PROFILES["smol"].recipe_hash() == "ce28b5f0eb80"
    smol = PROFILES["smol"]
    assert replace(smol, drafts=replace(smol.drafts, eagle=None)).recipe_hash() == "cb8027b77d18"
    assert PROFILES["smol-base"].recipe_hash() == "a112affd8c5c"
    assert PROFILES["smol-exit"].recipe_hash() == "81c087853204"
    assert PROFILES["smol-eagle"].model_names[-1] == "eagle"


def test_eagle_profiles_keep_their_hashes_through_later_settings():
    """answer_prompts (0 by default) and head_vocab (None) left the EAGLE profiles' cache
    folders where they were."""
    assert PROFILES["smol-eagle-long"].recipe_hash() == "0aca2a018f7d"
    assert PROFILES["smol-eagle-answers"].recipe_hash() == "eff72cf4681f"
    assert PROFILES["smol-eagle-answers-2k"].recipe_hash() == "b9b1596617da"


class _Specials:
    """A tokenizer's special ids, as eagle_head_vocab reads them."""

    all_special_ids = (0,)
    eos_token_id = 1


def _labelled(ids: list[int]) -> TeacherSample:
    """A one-position-per-id teacher sample whose top-1 is each id, with probability 1."""
    top = torch.tensor(ids)[:, None]
    return TeacherSample(torch.tensor([5, *ids]), 0, top, torch.zeros(len(ids), 1))


def test_a_stage_head_vocab_keeps_the_tokens_most_frequent_in_the_heads_own_data():
    target = build_tiny_pair()[1]
    stage = EagleStage(training=TrainConfig(steps=1, batch_size=1, lr=1e-3))
    drafts = DraftVocab.of(torch.arange(0, 96, 2), 96)
    data = EagleData([_labelled([7, 7, 9])], [], [], answers=[_labelled([11, 11, 11, 9, 3])])
    assert eagle_head_vocab(stage, data, drafts, target, _Specials()) is drafts
    cut = eagle_head_vocab(replace(stage, head_vocab=5), data, drafts, target, _Specials())
    assert cut.kept.tolist() == [0, 1, 7, 9, 11]
    assert cut.row_of[11] == 4 and cut.row_of[3] == -1


def _characters(text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
    """A tokenizer of one token per character (its code point)."""
    return {"input_ids": [ord(c) for c in text]}


def test_code_windows_are_consecutive_pieces_of_the_standard_library_source():
    windows = code_windows(_characters, 5, 40)
    assert [w.numel() for w in windows] == [40] * 5
    text = "".join(chr(int(i)) for w in windows for i in w)
    assert text == code_training_text(200)
    assert code_windows(_characters, 0, 40) == []
    with pytest.raises(ValueError, match="lower code_windows"):
        code_windows(_characters, 10**6, 256)
