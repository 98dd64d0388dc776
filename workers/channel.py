"""A direct, authenticated socket channel from the draft actor to a target rank.

A speculative round makes one draft-to-target call; through Ray's actor calls that costs about
0.75 ms here, a tenth of a small model's round. The target actor therefore also serves its
per-request calls (``prefill``, ``verify`` and the AR baseline's ``generate``; at a batch size
above 1 ``batch_forward`` and ``batch_generate``, ``workers.batch_target``) on a TCP listener
bound to its node's address, with a random key handed out through Ray, so only the draft actor
that asked for the address can call. Ray still creates, places, watches and kills the actors,
and every other call goes through Ray.

Security: the listener is reachable by anyone on the node's network, so it never trusts a byte
before the sender proved the key, and never lets one connection hold up another.

- Each accepted connection runs its handshake (:mod:`workers.channel_wire`: HMAC-SHA256
  challenge-response both ways, checked with ``hmac.compare_digest``) on its own thread, within
  ``HANDSHAKE_TIMEOUT_S`` for the whole exchange; at most ``MAX_PENDING_HANDSHAKES`` run at
  once, and a connection beyond them is closed at once (a client with the key retries a busy
  channel for ``CONNECT_PATIENCE_S``). The accept loop itself never reads.
- After the handshake every frame carries an HMAC under a per-connection, per-direction key and
  a sequence number, checked before its payload is decoded, and its length is refused beyond
  ``channel_wire.MAX_MESSAGE_BYTES`` before anything is allocated.
- A message is the method's name, a NUL byte, then the pickled argument tuple; the name is
  checked against the served methods before the arguments are unpickled. The reply is a pickled
  ``(True, value)`` or ``(False, exception)``, re-raised on the calling side.
- A bad message (oversize, bad HMAC, unknown method, undecodable) closes that connection with
  one log line (never the key); the server goes on serving the others.

Why pickle behind an HMAC rather than a fixed schema: the calls carry the engine's own typed
records (``VerifyRequest``, ``VerifyResponse`` with hidden-state tensors and a vocabulary row,
``SamplingConfig``, ``RequestSettings``, ``GenerationResult`` with its ``RoundRecord`` list, the
target's exceptions), and ``bench/placements.py`` sends ``TrialRequest`` and results over the
same framing; a schema codec would restate each of them and drift as they change. Only a
holder of the key, which Ray hands only to the driver's own actors (who can already run any
code through Ray), can produce a frame that gets unpickled, and the per-message cost stays one
HMAC-SHA256 of the payload.

The same message format serves any connection with ``send_bytes``/``recv_bytes``
(:func:`serve_connection`, :class:`ChannelClient` over a pipe end), as ``bench/actors.py``'s
Ray-free placement does over a pipe to a process it spawned itself.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers.channel_wire import ChannelBusy, WireError, accept_handshake, connect_handshake

CHANNEL_METHODS = frozenset({"prefill", "verify", "generate", "batch_forward", "batch_generate"})
#: Seconds a connection has to complete the whole handshake.
HANDSHAKE_TIMEOUT_S = 5.0
#: Handshakes running at once; a connection beyond them is closed at once.
MAX_PENDING_HANDSHAKES = 16
#: Seconds a client with the key keeps retrying a channel that is busy with handshakes.
CONNECT_PATIENCE_S = 4 * HANDSHAKE_TIMEOUT_S
#: Seconds between those retries, and the accept loop's pause after a failed accept.
RETRY_PAUSE_S = 0.05
#: Longest method name read ahead of the arguments.
MAX_METHOD_CHARS = 32

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChannelAddress:
    """Where a target rank's channel listens and the key that opens it (never shown)."""

    host: str
    port: int
    authkey: bytes = field(repr=False)


class Transport(Protocol):
    """A connection that moves whole messages: a channel socket or a ``multiprocessing`` pipe."""

    def send_bytes(self, payload: bytes) -> None:
        """Send one message."""

    def recv_bytes(self) -> bytes | memoryview:
        """Return the next message."""

    def close(self) -> None:
        """Close the connection."""


class BadMessage(ValueError):
    """A message that does not decode as a call of a served method."""


class UnknownMethod(BadMessage):
    """A call of a method the connection does not serve."""


def encode_call(method: str, args: tuple) -> bytes:
    """Return the message calling ``method`` with ``args``."""
    return method.encode("ascii") + b"\0" + pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)


def decode_call(payload: bytes | memoryview, methods: frozenset[str]) -> tuple[str, tuple]:
    """Return ``(method, args)`` of a message; the name is checked against ``methods`` before
    the arguments are unpickled. Raises :class:`BadMessage` (:class:`UnknownMethod`)."""
    head = bytes(payload[: MAX_METHOD_CHARS + 1])
    end = head.find(b"\0")
    if end < 0:
        raise BadMessage("the message names no method")
    method = head[:end].decode("ascii", errors="replace")
    if method not in methods:
        raise UnknownMethod(f"method {method!r} is not served on the channel")
    try:
        args = pickle.loads(payload[end + 1 :])
    except Exception as exc:  # any failure of untrusted-looking bytes is a bad message
        raise BadMessage(f"undecodable arguments of {method}: {type(exc).__name__}") from None
    if not isinstance(args, tuple):
        raise BadMessage(f"the arguments of {method} are not a tuple")
    return method, args


def serve_connection(
    conn: Transport,
    call: Callable[[str, tuple], Any],
    methods: frozenset[str] = CHANNEL_METHODS,
    peer: str = "a pipe",
) -> None:
    """Answer one client's calls of ``methods`` through ``call`` until it disconnects or sends
    a bad message (then one warning names ``peer`` and why, and the connection is closed)."""
    with contextlib.closing(conn):
        while True:
            try:
                method, args = decode_call(conn.recv_bytes(), methods)
            except (EOFError, ConnectionResetError):
                return  # the client hung up
            except UnknownMethod as exc:
                with contextlib.suppress(OSError):
                    _send(conn, (False, ValueError(str(exc))))
                log.warning("channel: closed the connection from %s: %s", peer, exc)
                return
            except (BadMessage, OSError) as exc:  # WireError is an OSError
                log.warning("channel: closed the connection from %s: %s", peer, exc)
                return
            try:
                reply = (True, call(method, args))
            except Exception as exc:  # the caller re-raises it, as Ray would
                reply = (False, exc)
            try:
                _send_reply(conn, reply)
            except OSError as exc:
                log.warning("channel: could not answer %s: %s", peer, exc)
                return


def _send_reply(conn: Transport, reply: tuple[bool, Any]) -> None:
    """Send ``reply``; an exception that does not pickle goes as a RuntimeError naming it."""
    try:
        _send(conn, reply)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        _send(conn, (False, RuntimeError(f"{reply[1]!r} (unpicklable: {exc})")))


def _send(conn: Transport, message: object) -> None:
    """Send ``message`` with the plain pickler.

    ``Connection.send`` would use multiprocessing's pickler, to which ``torch.multiprocessing``
    adds reductions that pass tensors as shared-memory handles of this host.
    """
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def serve_channel(host: str, call: Callable[[str, tuple], Any]) -> ChannelAddress:
    """Start a listener on ``host`` (any free port) whose clients' calls run ``call``.

    Each accepted client is authenticated and then served by its own daemon thread; ``call``
    must be safe to run from them (the target actor serialises it with its lock).
    """
    authkey = secrets.token_bytes(32)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = socket.create_server((host, 0), family=family, backlog=128)
    pending = threading.BoundedSemaphore(MAX_PENDING_HANDSHAKES)
    args = (server, authkey, call, pending)
    threading.Thread(target=_accept_forever, args=args, daemon=True, name="channel").start()
    bound_host, port = server.getsockname()[:2]
    return ChannelAddress(bound_host, port, authkey)


def _accept_forever(
    server: socket.socket,
    authkey: bytes,
    call: Callable[[str, tuple], Any],
    pending: threading.BoundedSemaphore,
) -> None:
    """Accept connections and hand each to its own handshake thread (:func:`_admit`); close at
    once those beyond ``MAX_PENDING_HANDSHAKES`` pending."""
    while True:
        try:
            sock, address = server.accept()
        except OSError as exc:  # out of descriptors, or a connection reset before accept
            log.warning("channel: accept failed: %s", exc)
            time.sleep(RETRY_PAUSE_S)
            continue
        peer = ":".join(str(part) for part in address[:2])
        if not pending.acquire(blocking=False):
            log.warning("channel: refused %s: %d handshakes pending", peer, MAX_PENDING_HANDSHAKES)
            sock.close()
            continue
        admit = threading.Thread(
            target=_admit, args=(sock, peer, authkey, call, pending), daemon=True
        )
        try:
            admit.start()
        except RuntimeError as exc:  # no thread to spare
            pending.release()
            sock.close()
            log.warning("channel: refused %s: %s", peer, exc)


def _admit(
    sock: socket.socket,
    peer: str,
    authkey: bytes,
    call: Callable[[str, tuple], Any],
    pending: threading.BoundedSemaphore,
) -> None:
    """Run the handshake of one connection (its pending slot is freed when it ends); serve the
    connection once the client proved the key, else close it with one warning."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        framed = accept_handshake(sock, authkey, HANDSHAKE_TIMEOUT_S)
    except (OSError, EOFError) as exc:  # a wrong proof, a stall (TimeoutError), a hang-up
        sock.close()
        log.warning("channel: closed %s during the handshake: %s", peer, exc or type(exc).__name__)
        return
    finally:
        pending.release()
    serve_connection(framed, call, CHANNEL_METHODS, peer)


class ChannelClient:
    """The calling side of one channel: a target rank's, or any connection served by
    :func:`serve_connection`."""

    def __init__(self, conn: Transport) -> None:
        self.conn = conn

    @classmethod
    def connect(cls, address: ChannelAddress) -> ChannelClient:
        """Open the channel at ``address`` (the handshake proves the key both ways), retrying
        for ``CONNECT_PATIENCE_S`` while it is busy with other handshakes."""
        give_up = time.monotonic() + CONNECT_PATIENCE_S
        while True:
            sock = socket.create_connection((address.host, address.port), HANDSHAKE_TIMEOUT_S)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return cls(connect_handshake(sock, address.authkey, HANDSHAKE_TIMEOUT_S))
            except ChannelBusy:
                sock.close()
                if time.monotonic() > give_up:
                    raise
            except BaseException:
                sock.close()
                raise
            time.sleep(RETRY_PAUSE_S)

    def send(self, method: str, *args: Any) -> None:
        """Send one call without waiting for its answer (so several ranks can work at once)."""
        self.conn.send_bytes(encode_call(method, args))

    def receive(self) -> Any:
        """Return the answer to the call sent last, re-raising the target's exception."""
        try:
            ok, value = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise
        except Exception as exc:  # an authenticated but undecodable reply
            raise WireError(f"undecodable reply: {type(exc).__name__}") from None
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
