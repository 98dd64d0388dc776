"""Draft kinds (workers.proposers): every kind × policy decodes losslessly, the n-gram lookup
drafts a repeated passage, a policy reads its match length, a trained EAGLE head gets drafts
accepted, and a worker's trial drafts with the EAGLE proposer it holds."""

from __future__ import annotations

import pytest
import torch
from support.draft_kinds import (
    GREEDY,
    PATHS,
    briefly_trained_head,
    check_lossless,
    tiny_pair_on_paths,
)
from support.eagle_heads import untrained_head
from support.tiny_models import prompts

from policies import POLICIES, make_policy
from workers.eagle.artifact import save_eagle_head
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.proposers import (
    DRAFT_KINDS,
    EagleProposer,
    NgramProposer,
    NgramSettings,
    make_proposer,
)
from workers.proposers.ngram import NgramIndex
from workers.records import BASELINE_POLICY, SamplingConfig
from workers.target import LocalTarget
from workers.trial import TrialRequest, run_trial

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models():
    """The tiny pair as (draft, target) ``CachedLM`` on each model path."""
    return tiny_pair_on_paths()


@pytest.fixture(scope="module")
def eagle_head(models):
    """An EAGLE head trained briefly on the tiny target's greedy continuations."""
    return briefly_trained_head(models)


@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
def test_greedy_output_equals_target_only_for_every_kind_and_policy(
    models, eagle_head, kind, policy_name
):
    """On the fast path (tests/integration/test_draft_kinds_paths.py: the transformers path)."""
    check_lossless(models, eagle_head, "plain_torch", kind, policy_name)


def _first_round(sequence: list[int], settings: NgramSettings, cap: int = 16) -> list[int]:
    """Return what an n-gram proposer drafts after ``sequence`` with nothing stopping it."""
    proposer = NgramProposer(settings)
    proposer.begin(torch.tensor(sequence))
    generator, wanted = torch.Generator(), frozenset({"match_length"})
    candidate = proposer.first(sequence, GREEDY, generator, wanted)
    drafted = []
    while candidate is not None and len(drafted) < cap:
        drafted.append(int(candidate.token))
        candidate = proposer.next(candidate, GREEDY, generator, wanted)
    return drafted


def test_an_ngram_proposer_drafts_the_repeat_of_a_repeated_passage():
    passage = [7, 8, 9, 10, 11, 12]
    sequence = [2, 3, *passage, 4, 5, *passage[:2]]
    assert _first_round(sequence, NgramSettings(n_max=3, n_min=1)) == [9, 10, 11, 12, 4, 5, 7, 8]
    assert _first_round(sequence, NgramSettings(), cap=3) == [9, 10, 11]


def test_the_lookup_prefers_the_longest_n_then_the_most_recent_match():
    # "5 6" ends at 2 and at 6; "4 5 6" only at 2: n = 3 wins, so 20 follows.
    assert _first_round([4, 5, 6, 20, 9, 5, 6, 30, 4, 5, 6], NgramSettings(n_max=3))[:1] == [20]
    # n = 2 only: the most recent "5 6" (ending at 6) is followed by 30.
    assert _first_round([4, 5, 6, 20, 9, 5, 6, 30, 4, 5, 6], NgramSettings(n_max=2))[:1] == [30]


def test_no_match_proposes_nothing_and_n_min_and_window_limit_the_lookup():
    assert _first_round([2, 3, 4, 5], NgramSettings()) == []
    sequence = [9, 1, 2, 3, 4, 5, 6, 9]
    assert _first_round(sequence, NgramSettings(n_min=1)) == [1, 2, 3, 4, 5, 6, 9][:16]
    assert _first_round(sequence, NgramSettings(n_min=2)) == []
    assert _first_round(sequence, NgramSettings(window=3)) == []
    assert _first_round(sequence, NgramSettings(window=7)) == [1, 2, 3, 4, 5, 6, 9]


def test_the_index_grows_incrementally_to_the_same_lookups_as_a_fresh_one():
    sequence = [
        int(t) for t in torch.randint(2, 6, (60,), generator=torch.Generator().manual_seed(1))
    ]
    grown = NgramIndex(NgramSettings(n_max=4))
    for end in range(2, len(sequence) + 1):
        fresh = NgramIndex(NgramSettings(n_max=4)).lookup(sequence[:end])
        assert grown.lookup(sequence[:end]) == fresh


def test_match_length_counts_the_agreeing_tokens_before_the_proposal():
    proposer = NgramProposer(NgramSettings(n_max=2))
    sequence = [2, 7, 8, 9, 10, 3, 7, 8, 9, 10]
    proposer.begin(torch.tensor(sequence))
    candidate = proposer.first(sequence, GREEDY, torch.Generator(), frozenset({"match_length"}))
    assert (int(candidate.token), candidate.match_length) == (3, 4)


def test_bad_ngram_settings_and_kinds_name_the_field():
    with pytest.raises(ValueError, match="n_min"):
        NgramSettings(n_max=1, n_min=2)
    with pytest.raises(ValueError, match="window"):
        NgramSettings(window=0)
    with pytest.raises(ValueError, match="unknown draft kind 'medusa'"):
        make_proposer("medusa")
    with pytest.raises(ValueError, match="'head_path' and 'target_model'"):
        make_proposer("eagle")
    with pytest.raises(ValueError, match=r"unknown parameter.*depth.*'eagle'"):
        make_proposer("eagle", depth=2)
    with pytest.raises(ValueError, match="n_maximum"):
        make_proposer("ngram", n_maximum=3)


def test_the_match_policy_drafts_as_far_as_the_match_length_vouches(models):
    """On a prompt that repeats a long passage the match-length policy drafts long rounds; on
    one-token matches it drafts one candidate a round."""
    _, target_lm = models["plain_torch"]
    target = LocalTarget(target_lm)
    passage = list(range(10, 18))
    prompt = torch.tensor([*passage, *passage, *passage[:3]])
    settings = RequestSettings(SamplingConfig(max_new_tokens=8))
    policy = make_policy("ngram_match", 6, ratio=1.0)
    result = speculative_generate(NgramProposer(), target, policy, prompt, settings)
    first = result.rounds[0]
    assert first.drafted == 6 and first.draft_forwards == 0
    short = torch.tensor([2, 3, 9, 3])
    result = speculative_generate(NgramProposer(), target, policy, short, settings)
    assert result.rounds[0].drafted == 1


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_trained_eagle_head_gets_drafts_accepted_and_stays_lossless(
    models, eagle_head, path, tmp_path
):
    """Trained briefly on the target's greedy continuations (the planted pattern) and loaded
    from its artifact by ``make_proposer``, the head's drafts are accepted far more often than
    an untrained head's on held-out prompts; the output is the target's with either."""
    _, target_lm = models[path]
    target = LocalTarget(target_lm)
    save_eagle_head(tmp_path / "head", eagle_head, {})
    trained = make_proposer("eagle", head_path=tmp_path / "head", target_model=target_lm.model)
    untrained = EagleProposer(untrained_head(target_lm.model))
    accepted = {}
    for name, proposer in (("trained", trained), ("untrained", untrained)):
        accepted[name] = 0
        for index, prompt in enumerate(prompts(8, seed=99)):
            prompt = prompt[:3]
            settings = RequestSettings(GREEDY, seed=index)
            reference = autoregressive_generate(target, prompt, settings).output_ids
            result = speculative_generate(
                proposer, target, make_policy("static", 4), prompt, settings
            )
            assert result.output_ids == reference, f"prompt {index} differs ({name})"
            accepted[name] += result.n_accepted
    assert accepted["trained"] > 2 * accepted["untrained"] + 8, accepted


def test_an_eagle_proposer_refuses_a_target_that_sent_no_features(models):
    """Without the target's features the head cannot draft: the error says what to ask for."""
    _, target_lm = models["plain_torch"]
    proposer = EagleProposer(untrained_head(target_lm.model))
    with pytest.raises(ValueError, match="want_features=True"):
        proposer.begin(torch.tensor([4, 5, 6]))
    proposer.begin(torch.tensor([4, 5, 6]), torch.zeros(2, 64))
    proposer.first([4, 5, 6], GREEDY, torch.Generator(), frozenset())
    with pytest.raises(ValueError, match="want_features=True"):
        proposer.observe(0, 7, None)


def _trial(kind: str, policy: str = "static") -> TrialRequest:
    """A three-prompt trial of ``policy`` drafting with ``kind`` (greedy)."""
    ids = [p[:3].tolist() for p in prompts(3, seed=5)]
    return TrialRequest(ids, GREEDY, policy, max_draft_len=4, draft_kind=kind)


def test_a_worker_holding_an_eagle_proposer_runs_every_prompt_of_a_trial(models, eagle_head):
    """A sweep's draft worker holds one EAGLE proposer and begins it afresh for every prompt:
    each output is the target's, and the head's drafts are accepted."""
    target = LocalTarget(models["plain_torch"][1])
    baseline = run_trial(None, target, _trial("lm", BASELINE_POLICY))
    results = run_trial(EagleProposer(eagle_head), target, _trial("eagle"))
    assert [r.output_ids for r in results] == [r.output_ids for r in baseline]
    assert sum(r.n_accepted for r in results) > 0


@pytest.mark.parametrize("kind", ["lm", "eagle"])
def test_a_worker_without_a_draft_of_the_requests_kind_says_so(models, eagle_head, kind):
    target = LocalTarget(models["plain_torch"][1])
    held = models["plain_torch"][0] if kind == "eagle" else EagleProposer(eagle_head)
    for draft in (None, held):
        with pytest.raises(ValueError, match=f"draft kind '{kind}' needs"):
            run_trial(draft, target, _trial(kind))
