"""A target group over direct channels (``workers.actors.ChannelTargetGroup``), without Ray:
trials through it decode as the local target does, the AR baseline makes one call per request,
and a broken channel says so after checking the ranks."""

from __future__ import annotations

import socket
import threading

import pytest
import torch
from support.eagle_heads import untrained_head
from support.tiny_models import build_tiny_pair, prompts

from policies import make_policy
from workers.actors import ChannelTargetGroup
from workers.channel import ChannelAddress, serve_channel
from workers.channel_wire import accept_handshake
from workers.engine import RequestSettings, speculative_generate
from workers.lm import CachedLM
from workers.proposers import EagleProposer
from workers.records import SamplingConfig
from workers.target import LocalTarget, VerifyRequest
from workers.trial import TrialRequest, run_trial

torch.set_num_threads(1)

SAMPLING = SamplingConfig(temperature=1.0, top_k=20, max_new_tokens=12)


class _Served:
    """A local target served on a channel, counting the calls it answers per method."""

    def __init__(self, target: LocalTarget) -> None:
        self.target = target
        self.calls: dict[str, int] = {}
        self.address = serve_channel("127.0.0.1", self)

    def __call__(self, method: str, args: tuple) -> object:
        self.calls[method] = self.calls.get(method, 0) + 1
        with torch.inference_mode():
            return getattr(self.target, method)(*args)


@pytest.fixture(scope="module")
def models() -> tuple[CachedLM, LocalTarget, LocalTarget]:
    """The tiny pair's draft, a target for local runs and a copy of it for the channel."""
    draft, target = build_tiny_pair()
    _, served = build_tiny_pair()
    return CachedLM(draft), LocalTarget(CachedLM(target)), LocalTarget(CachedLM(served))


@pytest.mark.parametrize("policy", ["ar", "static", "max_confidence"])
def test_a_trial_through_the_channels_decodes_as_the_local_target_does(models, policy) -> None:
    draft, local, remote = models
    served = _Served(remote)
    group = ChannelTargetGroup([served.address])
    request = TrialRequest(
        prompts=[p.tolist() for p in prompts(3, seed=6)],
        sampling=SAMPLING,
        policy=policy,
        max_draft_len=4,
        seed=11,
    )
    through = run_trial(draft, group, request)
    here = run_trial(draft, local, request)
    assert [r.output_ids for r in through] == [r.output_ids for r in here]
    assert [r.n_accepted for r in through] == [r.n_accepted for r in here]
    if policy == "ar":  # the token loop runs on the target's side: one call per request
        assert served.calls == {"generate": 3}
    else:  # one prefill per request, one verify per round
        assert served.calls["prefill"] == 3
        assert served.calls["verify"] == sum(len(r.rounds) for r in through)


def test_an_eagle_draft_gets_the_targets_features_through_the_channels(models) -> None:
    """The prompt's and every round's features cross the channel: an EAGLE draft decodes
    through the group as with the local target (same tokens, same acceptances)."""
    _, local, remote = models
    served = _Served(remote)
    group = ChannelTargetGroup([served.address])
    head = untrained_head(local.lm.model)
    runs = {}
    for name, target in (("through", group), ("here", local)):
        proposer = EagleProposer(head)
        runs[name] = [
            speculative_generate(
                proposer, target, make_policy("static", 3), p, RequestSettings(SAMPLING, seed=i)
            )
            for i, p in enumerate(prompts(3, seed=6))
        ]
    through, here = runs["through"], runs["here"]
    assert [r.output_ids for r in through] == [r.output_ids for r in here]
    assert [r.n_accepted for r in through] == [r.n_accepted for r in here]
    assert sum(r.n_drafted for r in through) > 0
    assert served.calls["prefill"] == 3
    assert served.calls["verify"] == sum(len(r.rounds) for r in through)


class _Checked(ChannelTargetGroup):
    """A group that records when it is asked to check its ranks."""

    checked = 0

    def _check_ranks(self) -> None:
        self.checked += 1


def _hanging_up_address() -> ChannelAddress:
    """Return the address of a listener that admits one client and hangs up at once (a rank
    that died mid-request)."""
    key = b"k" * 32
    listener = socket.create_server(("127.0.0.1", 0))

    def accept_and_hang_up() -> None:
        sock, _ = listener.accept()
        accept_handshake(sock, key, seconds=30).close()
        listener.close()

    threading.Thread(target=accept_and_hang_up, daemon=True).start()
    host, port = listener.getsockname()
    return ChannelAddress(host, port, key)


def test_a_broken_channel_checks_the_ranks_then_raises_and_reopens_on_the_next_call() -> None:
    group = _Checked([_hanging_up_address()])
    with pytest.raises(ConnectionError, match="target channel broke during verify"):
        group.verify(VerifyRequest(tokens=torch.tensor([1, 2, 3])))
    assert group.checked == 1 and group.channels == []
    with pytest.raises(ConnectionError):  # the next call opens again: the listener is gone
        group.verify(VerifyRequest(tokens=torch.tensor([1, 2, 3])))
    assert group.checked == 2
