"""A trial's prompts through one policy: ``persist_across_requests`` carries state from each
prompt to the next, live (``workers.trial.run_trial``) and replayed
(``orchestrator.analysis.costs.replay.replay_rounds``), reproducibly for a seed."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts

from orchestrator.analysis.costs.replay import replay_rounds
from orchestrator.run.replica import group_warmup_seconds
from orchestrator.sweep.spec import PairSpec
from orchestrator.sweep.target_sets import solo
from orchestrator.sweep.trial import PolicySetting, PromptSet, ServedPair, Trial
from policies import make_policy
from policies.replay import replay
from workers.engine import RequestSettings, speculative_generate
from workers.lm import CachedLM
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.trace import record_trace
from workers.trial import GPU_WARMUP_SECONDS, TrialRequest, run_trial, sample_seed, warm_up

torch.set_num_threads(1)

SAMPLING = SamplingConfig(temperature=1.0, top_k=20, max_new_tokens=16)
GREEDY = SamplingConfig(max_new_tokens=16)
SEED = 3


@pytest.fixture(scope="module")
def pair() -> tuple[CachedLM, LocalTarget]:
    draft, target = build_tiny_pair()
    return CachedLM(draft), LocalTarget(CachedLM(target))


def _rounds(results) -> list[list[tuple[int, int]]]:
    return [[(r.drafted, r.accepted) for r in result.rounds] for result in results]


def _request(policy: str, persist: bool, sampling: SamplingConfig, warmup: int = 0):
    return TrialRequest(
        prompts=[p.tolist() for p in prompts(6, seed=4)],
        sampling=sampling,
        policy=policy,
        params={"persist_across_requests": persist},
        max_draft_len=6,
        seed=SEED,
        warmup_samples=warmup,
    )


def _by_hand(pair, request: TrialRequest) -> list[list[tuple[int, int]]]:
    """The requests of ``request`` run in order through one policy object, by hand."""
    draft, target = pair
    policy = make_policy(request.policy, request.max_draft_len, **request.params)
    results = [
        speculative_generate(
            draft,
            target,
            policy,
            torch.tensor(prompt),
            RequestSettings(request.sampling, seed=sample_seed(request.seed, index)),
        )
        for index, prompt in enumerate(request.prompts)
    ]
    return _rounds(results)


@pytest.mark.parametrize(
    ("policy", "sampling"), [("beta_ts", SAMPLING), ("cali_ts", SAMPLING), ("hf_heuristic", GREEDY)]
)
def test_persistent_trial_equals_one_policy_over_its_requests_and_differs_from_fresh(
    pair, policy, sampling
):
    draft, target = pair
    persistent = _request(policy, True, sampling, warmup=2)
    transient = _request(policy, False, sampling, warmup=2)
    kept = _rounds(run_trial(draft, target, persistent))
    assert kept == _by_hand(pair, persistent)
    assert kept == _rounds(run_trial(draft, target, persistent))
    fresh = _rounds(run_trial(draft, target, transient))
    assert fresh == _by_hand(pair, transient)
    assert kept[0] == fresh[0]
    assert kept != fresh


def test_replay_stage_carries_state_across_a_trial_like_the_live_trial(pair):
    draft, target = pair
    request = _request("hf_heuristic", True, GREEDY)
    live = _rounds(run_trial(draft, target, request))
    traces = [
        record_trace(draft, target.lm, torch.tensor(p), GREEDY.max_new_tokens, 6)
        for p in request.prompts
    ]
    trial = _trial(request)
    replayed = [[(r.drafted, r.accepted) for r in rs] for rs in replay_rounds(trial, traces)]
    assert replayed == live
    fresh = [
        [(r.drafted, r.accepted) for r in replay(make_policy("hf_heuristic", 6), t, i)]
        for i, t in enumerate(traces)
    ]
    assert replayed != fresh


def _trial(request: TrialRequest) -> Trial:
    """A planner Trial with the request's sampling, policy, cap and seed (the rest unused here)."""
    return Trial(
        sweep="by-hand",
        pair="tiny",
        served=ServedPair("tiny-target", "hf", 1, "float32", False, "tiny-draft"),
        prompts=PromptSet("builtin:code", None, len(request.prompts), None),
        sampling=request.sampling,
        setting=PolicySetting(
            request.policy, tuple(sorted(request.params.items())), request.max_draft_len
        ),
        seed=request.seed,
        warmup_samples=0,
        baseline_id="baseline",
    )


def test_the_baseline_of_a_remote_target_runs_its_token_loop_inside_the_worker(
    micro_zoo, ray_local, monkeypatch
):
    """The AR baseline sends one call per request to the target actor, not one per token: the
    driver-side verify is never called, and the output equals the in-process loop's."""
    from workers.actors import ModelSpec, RemoteTargetGroup, TargetWorker
    from workers.lm import load_causal_lm

    path = str(micro_zoo.model_path("target"))
    group = RemoteTargetGroup([TargetWorker.remote(ModelSpec(path))])

    def no_rpc_per_token(self, request):
        raise AssertionError("the baseline called verify from the driver")

    monkeypatch.setattr(RemoteTargetGroup, "verify", no_rpc_per_token)
    request = TrialRequest(
        prompts=[p.tolist() for p in prompts(3, seed=5, vocab=200)],
        sampling=GREEDY,
        policy="ar",
        seed=SEED,
    )
    remote = run_trial(None, group, request)
    local = run_trial(None, LocalTarget(CachedLM(load_causal_lm(path))), request)
    assert [r.output_ids for r in remote] == [r.output_ids for r in local]
    assert all(len(r.rounds) == GREEDY.max_new_tokens for r in remote)


def test_a_verify_request_pickles_to_the_same_request():
    """Requests cross to the target actor pickled as lists; they must come back equal, dtypes
    included (an AR step's empty block and float probabilities too)."""
    import pickle

    from workers.target import VerifyRequest

    sampled = VerifyRequest(
        tokens=torch.tensor([5, 1, 2, 3]),
        draft_token_probs=torch.tensor([0.25, 0.5, 0.125]),
        want_hidden=True,
    )
    empty = VerifyRequest(tokens=torch.tensor([5]), draft_token_probs=torch.empty(0))
    for request in (sampled, empty):
        copy = pickle.loads(pickle.dumps(request))
        for name in ("tokens", "draft_tokens", "draft_token_probs"):
            a, b = getattr(request, name), getattr(copy, name)
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert copy.want_hidden == request.want_hidden


def test_warm_up_runs_one_pass_or_passes_until_its_time_is_up(pair) -> None:
    draft, target = pair
    request = TrialRequest(prompts(2), GREEDY, "static", max_draft_len=2)
    once = warm_up(draft, target, request, min_seconds=0.0)
    assert once.passes == 1
    timed = warm_up(draft, target, request, min_seconds=0.3)
    assert timed.seconds >= 0.3 and timed.passes >= 2
    assert all(cost > 0 for cost in timed.seconds_per_token)


@pytest.mark.parametrize(
    "target_gpus,draft_gpus,setting,expected",
    [
        (0, 0, None, 0.0),
        (0.4, 0.1, None, GPU_WARMUP_SECONDS),
        (0, 0.5, None, GPU_WARMUP_SECONDS),
        (1, 0, 3.0, 3.0),
    ],
)
def test_new_actors_warm_up_longer_when_their_group_uses_a_gpu(
    target_gpus, draft_gpus, setting, expected
) -> None:
    spec = PairSpec.model_validate(
        {
            "name": "p",
            "target": {"model": "t", "gpus": target_gpus},
            "draft": {"model": "d", "gpus": draft_gpus},
        }
    )
    assert group_warmup_seconds(setting, solo(spec)) == expected
