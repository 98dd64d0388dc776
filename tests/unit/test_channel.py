"""The direct draft-to-target channel: calls, errors, authentication, and overlap of prefill."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
from dataclasses import replace
from multiprocessing import AuthenticationError, Pipe
from pathlib import Path

import pytest

from workers import channel
from workers.channel import (
    ChannelAddress,
    ChannelClient,
    encode_call,
    serve_channel,
    serve_connection,
)
from workers.channel_wire import TAG_BYTES


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


def test_only_the_per_request_calls_are_served_and_another_closes_the_connection(served, caplog):
    recorder, address, client = served
    client.send("lm_reset")
    with pytest.raises(ValueError, match="'lm_reset' is not served"):
        client.receive()
    with pytest.raises((EOFError, OSError)):  # the server closed that connection
        client.call("generate", 1)
    assert _one_warning(caplog, address)
    assert _call_within_deadline(address, 1) == ("verify", 1)  # and serves the others
    assert [method for method, _ in recorder.calls] == ["verify"]


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
    client.close()  # the server returns after a method it does not serve, or a hang-up
    server.join(10)
    assert not server.is_alive()
    assert recorder.calls == [("usage", (3,))]


def test_a_client_without_the_key_is_refused_and_the_target_keeps_serving(served, caplog):
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
    assert _one_warning(caplog, address)


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


# ---------------------------------------------------------------------------------------------
# A channel no stranger can stall or feed code (real sockets on the loopback)
# ---------------------------------------------------------------------------------------------

#: Generous bound on anything that should happen "at once" or after a short handshake timeout.
DEADLINE_S = 30.0
#: The handshake timeout the tests run the server with (seconds).
HANDSHAKE_S = 1.0
#: The cap on pending handshakes the tests run the server with.
PENDING_CAP = 4


class _Evil:
    """Unpickling this runs a shell command that creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch):
    """A served recorder on a channel with a short handshake timeout and a small pending cap."""
    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT_S", HANDSHAKE_S)
    monkeypatch.setattr(channel, "MAX_PENDING_HANDSHAKES", PENDING_CAP)
    recorder = _Recorder()
    address = serve_channel("127.0.0.1", recorder)
    return recorder, address


def _stranger(address: ChannelAddress) -> socket.socket:
    """Open a plain TCP connection to the channel (no key)."""
    sock = socket.create_connection((address.host, address.port), timeout=DEADLINE_S)
    sock.settimeout(DEADLINE_S)
    return sock


def _bytes_until_closed(sock: socket.socket) -> int:
    """Read until the server closes ``sock`` (fails after ``DEADLINE_S``); return bytes read.

    A server that closes with bytes of ours unread resets the connection: that is closed too.
    """
    received = 0
    with sock:
        try:
            while chunk := sock.recv(4096):
                received += len(chunk)
        except ConnectionResetError:
            pass
    return received


def _call_within_deadline(address: ChannelAddress, *args: object) -> object:
    """Connect a real client and make one ``verify`` call on a thread; fail past the deadline
    (the unfixed channel blocked the connect for ever)."""
    answers: list[object] = []

    def connect_and_call() -> None:
        client = ChannelClient.connect(address)
        try:
            answers.append(client.call("verify", *args))
        finally:
            client.close()

    caller = threading.Thread(target=connect_and_call, daemon=True)
    caller.start()
    caller.join(DEADLINE_S)
    assert answers, "a client with the key was not served within the deadline"
    return answers[0]


def _raw(client: ChannelClient) -> socket.socket:
    """Return a socket on the authenticated client's connection, to write raw bytes on it."""
    return socket.socket(fileno=os.dup(client.conn.fileno()))


def test_an_idle_stranger_does_not_block_a_client_with_the_key(quick) -> None:
    _, address = quick
    idle = _stranger(address)  # connects and sends nothing
    assert _call_within_deadline(address, 1) == ("verify", 1)
    _bytes_until_closed(idle)  # the server drops it once the handshake times out


def test_idle_strangers_beyond_the_pending_cap_are_closed_at_once_and_block_no_one(quick) -> None:
    _, address = quick
    idle = [_stranger(address) for _ in range(PENDING_CAP + 6)]
    assert _call_within_deadline(address, 2) == ("verify", 2)
    received = [_bytes_until_closed(sock) for sock in idle]
    # The excess ones were closed before the server sent them anything (no handshake thread).
    assert sum(count == 0 for count in received) >= 6, received


def test_a_stranger_stalling_mid_handshake_is_closed_and_others_are_served(quick) -> None:
    _, address = quick
    stalled = _stranger(address)
    stalled.sendall(b"\x00\x00\x00\x40" + b"half")  # a length prefix and a few bytes, then nothing
    assert _call_within_deadline(address, 3) == ("verify", 3)
    _bytes_until_closed(stalled)


def test_an_authenticated_client_stalling_mid_message_holds_only_its_own_connection(
    quick, caplog
) -> None:
    recorder, address = quick
    stalled = ChannelClient.connect(address)
    raw = _raw(stalled)
    raw.sendall(struct.pack("!i", 100) + b"ten bytes.")
    assert _call_within_deadline(address, 4) == ("verify", 4)
    raw.close()
    stalled.close()
    assert [args for _, args in recorder.calls] == [(4,)]
    # The server notices the hang-up on its own thread: wait for its warning here, so that it
    # is not logged during (and counted by) the next test.
    _wait_for_warning(caplog)
    assert _one_warning(caplog, address)


def test_a_two_gib_length_prefix_closes_the_connection_promptly(quick, caplog) -> None:
    _, address = quick
    client = ChannelClient.connect(address)
    raw = _raw(client)
    raw.settimeout(DEADLINE_S)
    raw.sendall(struct.pack("!i", 0x7FFFFFF0))  # about 2 GiB announced, nothing follows
    assert _bytes_until_closed(raw) == 0
    client.close()
    assert _call_within_deadline(address, 5) == ("verify", 5)
    assert _one_warning(caplog, address)


def test_a_pickle_from_a_stranger_never_runs(quick, tmp_path: Path, caplog) -> None:
    _, address = quick
    marker = tmp_path / "pwned"
    payload = pickle.dumps(("verify", (_Evil(marker),)))
    stranger = _stranger(address)
    stranger.sendall(struct.pack("!i", len(payload)) + payload)
    _bytes_until_closed(stranger)
    assert _call_within_deadline(address, 6) == ("verify", 6)
    assert not marker.exists()
    assert address.authkey.hex() not in caplog.text


def test_a_pickle_written_after_the_handshake_without_the_message_key_never_runs(
    quick, tmp_path: Path, caplog
) -> None:
    """An authenticated connection's bytes must carry the message HMAC before they are read as
    a pickle (here: a plain length-prefixed pickle, as the unfixed framing read it)."""
    _, address = quick
    marker = tmp_path / "pwned"
    payload = pickle.dumps(("verify", (_Evil(marker),)))
    client = ChannelClient.connect(address)
    raw = _raw(client)
    raw.settimeout(DEADLINE_S)
    raw.sendall(struct.pack("!i", len(payload)) + payload + bytes(32))
    _bytes_until_closed(raw)
    client.close()
    assert not marker.exists()
    assert _call_within_deadline(address, 7) == ("verify", 7)
    assert _one_warning(caplog, address)


def test_a_pickle_in_a_frame_with_a_wrong_hmac_never_runs(quick, tmp_path: Path, caplog) -> None:
    _, address = quick
    marker = tmp_path / "pwned"
    payload = encode_call("verify", (_Evil(marker),))
    client = ChannelClient.connect(address)
    raw = _raw(client)
    raw.settimeout(DEADLINE_S)
    raw.sendall(struct.pack("!I", len(payload)) + bytes(TAG_BYTES) + payload)
    _bytes_until_closed(raw)
    client.close()
    assert not marker.exists()
    assert _call_within_deadline(address, 9) == ("verify", 9)
    assert _one_warning(caplog, address)


class _Tap:
    """A socket stand-in that keeps a copy of what is sent through it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        self.sock.sendall(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_a_replayed_frame_is_refused(quick, caplog) -> None:
    recorder, address = quick
    client = ChannelClient.connect(address)
    tap = _Tap(client.conn.sock)
    client.conn.sock = tap
    assert client.call("verify", 10) == ("verify", 10)
    raw = _raw(client)
    raw.settimeout(DEADLINE_S)
    raw.sendall(b"".join(tap.sent))  # the same frame again: its sequence number is spent
    assert _bytes_until_closed(raw) == 0
    client.close()
    assert [args for _, args in recorder.calls] == [(10,)]
    assert _one_warning(caplog, address)


def test_garbage_after_the_handshake_closes_that_connection_with_one_log_line(
    quick, caplog
) -> None:
    _, address = quick
    client = ChannelClient.connect(address)
    raw = _raw(client)
    raw.settimeout(DEADLINE_S)
    raw.sendall(struct.pack("!i", 40) + os.urandom(40) + os.urandom(32))
    _bytes_until_closed(raw)
    client.close()
    assert _call_within_deadline(address, 8) == ("verify", 8)
    assert _one_warning(caplog, address)


def test_the_address_repr_does_not_show_the_key() -> None:
    address = ChannelAddress("127.0.0.1", 1234, b"\x01secret-key-bytes\x02" * 2)
    shown = repr(address) + str(address)
    assert "secret-key-bytes" not in shown and "127.0.0.1" in shown and "1234" in shown


def _wait_for_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Return once the channel has logged a warning; fail after ``DEADLINE_S``."""
    deadline = time.monotonic() + DEADLINE_S
    while not any(r.name == channel.log.name and r.levelname == "WARNING" for r in caplog.records):
        assert time.monotonic() < deadline, "the channel logged no warning"
        time.sleep(0.05)


def _one_warning(caplog: pytest.LogCaptureFixture, address: ChannelAddress) -> bool:
    """True when the channel logged exactly one warning for the bad connection, without the
    key and without a traceback."""
    warnings = [
        r for r in caplog.records if r.name == channel.log.name and r.levelname == "WARNING"
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    (record,) = warnings
    assert record.exc_info is None
    assert address.authkey.hex() not in caplog.text and repr(address.authkey) not in caplog.text
    return True
