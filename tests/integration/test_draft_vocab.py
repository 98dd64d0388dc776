"""Drafts whose LM head covers only ``config.draft_vocab`` (frequency-ranked heads, FR-Spec):
logits, greedy losslessness, exact sampling, replayed traces, the config round trip and a Ray
sweep with such a draft given as a local directory."""

from __future__ import annotations

import math
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from scipy import stats
from support.tiny_models import prompts
from transformers import AutoConfig, AutoTokenizer

from policies import make_policy
from policies.replay import replay
from workers.datasets import DatasetSpec, load_prompts
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import OUTSIDE_VOCAB_LOGIT, CachedLM, load_causal_lm, restricted_head
from workers.records import SamplingConfig
from workers.sampling import warp_probs
from workers.target import LocalTarget
from workers.trace import record_trace
from workers.verification import residual_distribution, speculative_step_distribution

#: The micro zoo's vocabulary size and how many of its most frequent response tokens are kept.
VOCAB = 1024
KEPT_FREQUENT = 64
MAX_NEW = 24
torch.set_num_threads(1)


@dataclass(frozen=True)
class Dirs:
    """The micro target, its draft-s, a copy of draft-s restricted to ``kept``, and the EOS."""

    target: Path
    draft: Path
    restricted: Path
    kept: list[int]
    eos: int


def save_restricted(source: Path, kept: list[int], destination: Path) -> None:
    """Save the model at ``source`` with ``config.draft_vocab = kept`` (and its tokenizer)."""
    model = load_causal_lm(source)
    model.config.draft_vocab = kept
    model.save_pretrained(destination)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, destination / name)


@pytest.fixture(scope="module")
def dirs(micro_zoo, tmp_path_factory: pytest.TempPathFactory) -> Dirs:
    """Keep the 64 most frequent tokens of the builtin code prompts' text, plus the EOS."""
    target_path, draft_path = micro_zoo.model_path("target"), micro_zoo.model_path("draft-s")
    tokenizer = AutoTokenizer.from_pretrained(micro_zoo.tokenizer)
    counts: Counter[int] = Counter()
    for prompt in load_prompts(DatasetSpec("builtin:code", samples=16)):
        counts.update(tokenizer(prompt.text)["input_ids"])
    eos = int(AutoConfig.from_pretrained(target_path).eos_token_id)
    kept = sorted({token for token, _ in counts.most_common(KEPT_FREQUENT)} | {eos})
    restricted = tmp_path_factory.mktemp("restricted") / "draft-s-fr"
    save_restricted(draft_path, kept, restricted)
    return Dirs(target_path, draft_path, restricted, kept, eos)


@pytest.fixture(scope="module")
def target(dirs: Dirs) -> LocalTarget:
    """The micro target for the engine."""
    return LocalTarget(CachedLM(load_causal_lm(dirs.target)))


@pytest.fixture(scope="module")
def draft(dirs: Dirs) -> CachedLM:
    """The restricted draft on the default (fast) path."""
    return CachedLM(load_causal_lm(dirs.restricted))


def test_config_round_trip_keeps_draft_vocab(dirs: Dirs, tmp_path: Path) -> None:
    model = load_causal_lm(dirs.restricted)
    assert model.config.draft_vocab == dirs.kept
    assert model.config.vocab_size == VOCAB
    model.save_pretrained(tmp_path / "again")
    assert load_causal_lm(tmp_path / "again").config.draft_vocab == dirs.kept
    assert getattr(load_causal_lm(dirs.draft).config, "draft_vocab", None) is None


def test_a_restricted_model_is_refused_as_a_target(dirs: Dirs, draft: CachedLM) -> None:
    with pytest.raises(ValueError, match="a target must score its whole vocabulary"):
        LocalTarget(draft)
    assert LocalTarget(CachedLM(load_causal_lm(dirs.draft))).lm.vocab_kept is None


def test_draft_vocab_must_be_sorted_distinct_ids_inside_the_head(dirs: Dirs) -> None:
    model = load_causal_lm(dirs.draft)
    for bad in ([5, 3], [3, 3], [], [VOCAB], [-1, 2]):
        model.config.draft_vocab = bad
        with pytest.raises(ValueError, match="draft_vocab"):
            restricted_head(model)


@pytest.mark.parametrize("fast", [True, False])
def test_logits_equal_the_full_head_on_kept_columns_and_the_fill_elsewhere(
    dirs: Dirs, fast: bool
) -> None:
    full = CachedLM(load_causal_lm(dirs.draft), fast=fast, single_step="plain")
    restricted = CachedLM(load_causal_lm(dirs.restricted), fast=fast, single_step="auto")
    assert restricted.fast_path == fast and restricted.calibration is not None
    assert (full.vocab_kept, restricted.vocab_kept) == (None, len(dirs.kept))
    kept = torch.tensor(dirs.kept)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[kept] = False
    prompt = prompts(1, seed=5, vocab=VOCAB)[0]
    pairs = [(full.full_logits(prompt), restricted.full_logits(prompt))]
    for lm in (full, restricted):
        lm.reset()
    pairs.append((full.forward(prompt).logits, restricted.forward(prompt).logits))
    token = prompt[:1]
    pairs.append((full.forward(token).logits, restricted.forward(token).logits))
    for expected, got in pairs:
        assert got.shape == expected.shape == (got.shape[0], VOCAB)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got[:, kept], expected[:, kept])
        assert (got[:, outside] == OUTSIDE_VOCAB_LOGIT).all()


@pytest.mark.parametrize(
    "name,params", [("static", {}), ("adaedl", {"threshold": 0.3}), ("svip", {})]
)
def test_greedy_output_equals_target_only(dirs, target, draft, name, params) -> None:
    drafted = accepted = 0
    emitted: set[int] = set()
    for index, prompt in enumerate(prompts(8, seed=3, vocab=VOCAB)):
        settings = RequestSettings(SamplingConfig(max_new_tokens=MAX_NEW), index, dirs.eos)
        reference = autoregressive_generate(target, prompt, settings).output_ids
        result = speculative_generate(
            draft, target, make_policy(name, 4, **params), prompt, settings
        )
        assert result.output_ids == reference, f"prompt {index} differs under {name}"
        emitted.update(reference)
        drafted, accepted = drafted + result.n_drafted, accepted + result.n_accepted
        for record in result.rounds:
            for value in (record.mean_entropy, record.min_max_prob):
                assert value is None or math.isfinite(value)
    assert drafted > 0 and accepted > 0, "the restricted draft should get tokens accepted"
    assert emitted - set(dirs.kept), "the target should emit tokens outside the draft vocab"


def test_replayed_trace_of_a_restricted_draft_equals_live_rounds(dirs, target, draft) -> None:
    kept = set(dirs.kept)
    for index, prompt in enumerate(prompts(4, seed=7, vocab=VOCAB)):
        trace = record_trace(draft, target.lm, prompt, MAX_NEW, 4, dirs.eos)
        predictions = [*trace.on_path, *(p for d in trace.off_path.values() for p in d)]
        assert all(p.token in kept for p in predictions)
        assert all(math.isfinite(p.entropy) and math.isfinite(p.margin) for p in predictions)
        settings = RequestSettings(SamplingConfig(max_new_tokens=MAX_NEW), index, dirs.eos)
        live = speculative_generate(
            draft, target, make_policy("adaedl", 4, threshold=0.3), prompt, settings
        )
        replayed = replay(make_policy("adaedl", 4, threshold=0.3), trace, seed=index)
        assert [(r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in live.rounds] == [
            (r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in replayed
        ]


def _first_step_rows(dirs: Dirs, target, draft, prompt, sampling) -> tuple[torch.Tensor, ...]:
    """Return (p, q, q of the unrestricted draft) warped at the prompt's next position."""
    full = CachedLM(load_causal_lm(dirs.draft), single_step="plain")
    p, q, q_full = (
        warp_probs(lm.full_logits(prompt)[-1].double(), sampling) for lm in (target.lm, draft, full)
    )
    return p, q, q_full


def _g_test(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Return the G-test p-value of ``counts`` against ``probs``, pooling cells expected < 5."""
    expected = probs * counts.sum()
    big = expected >= 5
    observed = [*counts[big].tolist(), float(counts[~big].sum())]
    wanted = [*expected[big].tolist(), float(expected[~big].sum())]
    if wanted[-1] < 1e-9:
        if observed[-1] > 0:
            return 0.0
        observed, wanted = observed[:-1], wanted[:-1]
    wanted = [w * sum(observed) / sum(wanted) for w in wanted]
    return float(stats.power_divergence(observed, wanted, lambda_="log-likelihood")[1])


def test_sampled_first_token_follows_the_target_and_a_wrong_residual_would_not(
    dirs, target, draft
) -> None:
    sampling = SamplingConfig(temperature=1.0, top_k=24, max_new_tokens=2)
    prompt = prompts(1, seed=9, vocab=VOCAB)[0]
    p, q, q_full = _first_step_rows(dirs, target, draft, prompt, sampling)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[torch.tensor(dirs.kept)] = False
    assert (q[outside] == 0).all() and torch.isfinite(q).all()
    assert float(p[outside].sum()) > 0.1, "the target must put mass outside the draft vocab"
    torch.testing.assert_close(speculative_step_distribution(p, q), p, atol=1e-12, rtol=0)
    wrong = torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * residual_distribution(p, q_full)
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    runs = 1500
    for seed in range(runs):
        result = speculative_generate(
            draft, target, make_policy("static", 1), prompt, RequestSettings(sampling, seed=seed)
        )
        counts[result.output_ids[0]] += 1
    assert _g_test(counts, p) > 0.001, "the first token does not follow the target"
    assert _g_test(counts, wrong) < 1e-6, "the test cannot tell a residual that ignores q = 0"


def test_sampled_runs_with_entropy_policies_stay_finite(dirs, target, draft) -> None:
    sampling = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9, max_new_tokens=MAX_NEW)
    for name, params in (("adaedl", {"threshold": 0.3}), ("svip", {})):
        drafted = 0
        for seed, prompt in enumerate(prompts(6, seed=13, vocab=VOCAB)):
            settings = RequestSettings(sampling, seed, dirs.eos)
            result = speculative_generate(
                draft, target, make_policy(name, 4, **params), prompt, settings
            )
            assert result.output_ids and all(0 <= t < VOCAB for t in result.output_ids)
            drafted += result.n_drafted
            for record in result.rounds:
                assert record.mean_entropy is None or math.isfinite(record.mean_entropy)
        assert drafted > 0, f"{name} drafted nothing: the test would not reach the features"


def test_training_forward_states_give_the_engine_logits(dirs: Dirs, draft: CachedLM) -> None:
    from training.jobs.head_data import forward_states

    prompt = prompts(1, seed=17, vocab=VOCAB)[0]
    _, logits = forward_states(load_causal_lm(dirs.restricted), prompt[None])
    torch.testing.assert_close(logits[0], draft.full_logits(prompt))


SWEEP = """
name: draft-vocab
pairs:
  - name: micro-fr
    target: {{model: "zoo:micro/target"}}
    draft: {{model: "{draft}"}}
datasets:
  - {{name: "builtin:code", samples: 2, max_new_tokens: 8}}
temperatures: [0.0, 0.8]
policies:
  - name: static
max_draft_lens: [3]
seeds: [0]
execution: {{retries: 0, warmup_samples: 1}}
"""


@pytest.mark.slow
def test_a_sweep_runs_a_restricted_draft_from_a_local_directory(
    dirs: Dirs, job_env: Path, ray_local: None, tmp_path: Path
) -> None:
    from orchestrator import api
    from orchestrator.store import open_store

    sweep_file = tmp_path / "fr.yaml"
    sweep_file.write_text(SWEEP.format(draft=dirs.restricted), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'fr.db'}"
    frame = api.run_sweep(sweep_file, db=url, progress=False).to_dataframe()
    assert len(frame) == 4 and (frame["status"] == "done").all()
    assert (frame.loc[~frame["is_baseline"], "n_drafted"] > 0).all()
    with open_store(url, read_only=True) as store:
        outputs = {
            (row.temperature, row.is_baseline): [s.output_ids for s in store.sample_outputs(tid)]
            for row, tid in zip(frame.itertuples(), frame["trial_id"], strict=True)
        }
    assert outputs[(0.0, False)] == outputs[(0.0, True)]
