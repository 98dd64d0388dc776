"""The direct draft-to-target channel: calls, errors, authentication, and overlap of prefill."""

from __future__ import annotations

import threading
from dataclasses import replace
from multiprocessing import AuthenticationError, Pipe

import pytest

from workers.channel import ChannelClient, serve_channel, serve_connection


class _Recorder:
    """A stand-in target that records its calls (the channel only moves data)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, method: str, args: tuple) -> object:
        self.release.wait(timeout=10)
        self.calls.append((method, args))
        if args and args[0] == "boom":
            raise ValueError("target says boom")
        return (method, *args)


@pytest.fixture
def served():
    recorder = _Recorder()
    address = serve_channel("127.0.0.1", recorder)
    client = ChannelClient.connect(address)
    yield recorder, address, client
    client.close()


def test_a_call_returns_the_targets_answer_in_order(served):
    recorder, _, client = served
    for index in range(3):
        client.send("verify", index, [1, 2])
        assert client.receive() == ("verify", index, [1, 2])
    assert [args[0] for _, args in recorder.calls] == [0, 1, 2]


def test_the_targets_exception_is_raised_on_the_calling_side(served):
    _, _, client = served
    client.send("prefill", "boom")
    with pytest.raises(ValueError, match="target says boom"):
        client.receive()
    client.send("prefill", "fine")
    assert client.receive() == ("prefill", "fine")


def test_only_the_per_request_calls_are_served(served):
    recorder, _, client = served
    client.send("lm_reset")
    with pytest.raises(ValueError, match="'lm_reset' is not served"):
        client.receive()
    assert client.call("generate", 1) == ("generate", 1)
    assert [method for method, _ in recorder.calls] == ["generate"]


def test_any_connection_serves_the_methods_it_is_given():
    """A pipe end served on a thread answers its own method set through the same framing."""
    recorder = _Recorder()
    near, far = Pipe()
    server = threading.Thread(
        target=serve_connection, args=(far, recorder, frozenset({"usage"})), daemon=True
    )
    server.start()
    client = ChannelClient(near)
    assert client.call("usage", 3) == ("usage", 3)
    with pytest.raises(ValueError, match="'verify' is not served"):
        client.call("verify", 4)
    client.close()  # the server returns once its client hangs up
    server.join(10)
    assert not server.is_alive()
    assert recorder.calls == [("usage", (3,))]


def test_a_client_without_the_key_is_refused_and_the_target_keeps_serving(served):
    recorder, address, client = served
    with pytest.raises(AuthenticationError):
        ChannelClient.connect(replace(address, authkey=b"not the key"))
    client.send("verify", 7)
    assert client.receive() == ("verify", 7)
    # The listener survives the failed handshake: a client with the key still gets in (a dead
    # listener would leave it waiting for the challenge for ever, hence the thread).
    connected: list[ChannelClient] = []
    opener = threading.Thread(
        target=lambda: connected.append(ChannelClient.connect(address)), daemon=True
    )
    opener.start()
    opener.join(10)
    assert connected, "no new client was accepted after a failed handshake"
    later = connected[0]
    try:
        later.send("verify", 8)
        assert later.receive() == ("verify", 8)
    finally:
        later.close()
    assert len(recorder.calls) == 2


def test_send_returns_before_the_target_is_done(served):
    recorder, _, client = served
    recorder.release.clear()
    client.send("prefill", "slow")
    assert recorder.calls == []  # the caller is free while the target works
    recorder.release.set()
    assert client.receive() == ("prefill", "slow")


def test_two_clients_are_served_independently(served):
    _, address, client = served
    other = ChannelClient.connect(address)
    try:
        client.send("verify", "a")
        other.send("verify", "b")
        assert other.receive() == ("verify", "b")
        assert client.receive() == ("verify", "a")
    finally:
        other.close()
