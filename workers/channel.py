"""A direct, authenticated socket channel from the draft actor to a target rank.

A speculative round makes one draft-to-target call; through Ray's actor calls that costs about
0.75 ms here, a tenth of a small model's round. The target actor therefore also serves its
per-request calls (``prefill``, ``verify`` and the AR baseline's ``generate``) on a
``multiprocessing.connection`` listener bound to its node's address (HMAC challenge with a random
key handed out through Ray, so only the draft actor that asked for the address can call). Ray
still creates, places, watches and kills the actors, and every other call goes through Ray. A
message is one pickled ``(method, args)`` tuple; the reply is ``(True, value)`` or
``(False, exception)``, re-raised on the calling side. The same framing serves any connection
(:func:`serve_connection`, :class:`ChannelClient` over a pipe end), as ``bench/actors.py``'s
Ray-free placement does.
"""

from __future__ import annotations

import pickle
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

CHANNEL_METHODS = frozenset({"prefill", "verify", "generate"})


@dataclass(frozen=True)
class ChannelAddress:
    """Where a target rank's channel listens and the key that opens it."""

    host: str
    port: int
    authkey: bytes


def serve_connection(
    conn: Connection,
    call: Callable[[str, tuple], Any],
    methods: frozenset[str] = CHANNEL_METHODS,
) -> None:
    """Answer one client's calls of ``methods`` through ``call`` until it disconnects."""
    with conn:
        while True:
            try:
                method, args = _receive(conn)
            except (EOFError, OSError):
                return
            if method not in methods:
                _send(conn, (False, ValueError(f"method {method!r} is not served on the channel")))
                continue
            try:
                reply = (True, call(method, args))
            except Exception as exc:  # the caller re-raises it, as Ray would
                reply = (False, exc)
            _send_reply(conn, reply)


def _send_reply(conn: Connection, reply: tuple[bool, Any]) -> None:
    """Send ``reply``; an exception that does not pickle goes as a RuntimeError naming it."""
    try:
        _send(conn, reply)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        _send(conn, (False, RuntimeError(f"{reply[1]!r} (unpicklable: {exc})")))


def _send(conn: Connection, message: object) -> None:
    """Send ``message`` with the plain pickler.

    ``Connection.send`` would use multiprocessing's pickler, to which ``torch.multiprocessing``
    adds reductions that pass tensors as shared-memory handles of this host.
    """
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(conn: Connection) -> Any:
    """Return the next message sent by :func:`_send`."""
    return pickle.loads(conn.recv_bytes())


def serve_channel(host: str, call: Callable[[str, tuple], Any]) -> ChannelAddress:
    """Start a listener on ``host`` (any free port) whose clients' calls run ``call``.

    Each accepted client is served by its own daemon thread; ``call`` must be safe to run from
    them (the target actor serialises it with its lock).
    """
    authkey = secrets.token_bytes(32)
    listener = Listener((host, 0), authkey=authkey)

    def accept_forever() -> None:
        while True:
            try:
                conn = listener.accept()
            except (AuthenticationError, OSError, EOFError):
                continue  # a client that failed the handshake, or one that hung up during it
            threading.Thread(target=serve_connection, args=(conn, call), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True, name="target-channel").start()
    bound_host, port = listener.address
    return ChannelAddress(bound_host, port, authkey)


class ChannelClient:
    """The calling side of one channel: a target rank's, or any connection served by
    :func:`serve_connection`."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @classmethod
    def connect(cls, address: ChannelAddress) -> ChannelClient:
        """Open the channel at ``address`` (the handshake proves the key)."""
        return cls(Client((address.host, address.port), authkey=address.authkey))

    def send(self, method: str, *args: Any) -> None:
        """Send one call without waiting for its answer (so several ranks can work at once)."""
        _send(self.conn, (method, args))

    def receive(self) -> Any:
        """Return the answer to the call sent last, re-raising the target's exception."""
        ok, value = _receive(self.conn)
        if not ok:
            raise value
        return value

    def call(self, method: str, *args: Any) -> Any:
        """Send one call and return its answer."""
        self.send(method, *args)
        return self.receive()

    def close(self) -> None:
        """Close the connection (the target keeps serving others)."""
        self.conn.close()
