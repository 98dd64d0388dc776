"""The channel's wire: an HMAC handshake, then size-capped frames that each carry an HMAC.

Handshake (fixed sizes, so nothing is framed or decoded before the peer proved the key; both
sides bound it by one deadline): the server sends ``MAGIC`` and a random nonce; the client
answers with its own nonce and ``HMAC(key, "client proof" | both nonces)``; the server checks it
with ``hmac.compare_digest`` and answers ``HMAC(key, "server proof" | both nonces)``, which the
client checks in turn. Each direction then has its own message key, ``HMAC(key, label | both
nonces)``, so a connection's keys are fresh and a frame from one connection or direction means
nothing on another.

Frame: a 4-byte big-endian payload length, checked against ``MAX_MESSAGE_BYTES`` before anything
else is read or allocated; a 32-byte ``HMAC-SHA256(direction key, sequence number | payload)``;
the payload. The sequence number counts the direction's frames (never sent), so a replayed,
dropped or reordered frame fails its check. A payload is handed on only after its HMAC matched.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import time
from multiprocessing import AuthenticationError

#: Sent first by the server: the protocol and its version.
MAGIC = b"specsweep-channel/1\n"
NONCE_BYTES = 32
TAG_BYTES = hashlib.sha256().digest_size
#: The largest payload either side accepts (a verify reply with a vocabulary row or hidden
#: states, or a whole AR request's result, is well under 1 MiB).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Payloads up to this size go out in one send with their header.
JOIN_BELOW_BYTES = 64 * 1024
#: The most bytes asked of one ``recv`` once a frame arrives in parts.
RECEIVE_CHUNK_BYTES = 1024 * 1024
_LENGTH = struct.Struct("!I")


class WireError(ConnectionError):
    """The peer broke the protocol: a bad handshake, an oversize frame or a bad HMAC."""


class ChannelBusy(WireError):
    """The server closed the connection before its challenge (too many pending handshakes)."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    """Return HMAC-SHA256 of the concatenated ``parts`` under ``key``."""
    return hmac.digest(key, b"".join(parts), "sha256")


class FramedSocket:
    """An authenticated connection: frames out under one key, frames in checked under the
    other (see the module doc)."""

    def __init__(self, sock: socket.socket, send_key: bytes, receive_key: bytes) -> None:
        self.sock = sock
        # Keyed once; each frame's HMAC starts from a copy (cheaper than keying per frame).
        self._send_mac = hmac.new(send_key, digestmod="sha256")
        self._receive_mac = hmac.new(receive_key, digestmod="sha256")
        self._sent = self._received = 0

    def send_bytes(self, payload: bytes) -> None:
        """Send ``payload`` as one frame."""
        tag = self._tag(self._send_mac, self._sent, payload)
        self._sent += 1
        header = _LENGTH.pack(len(payload)) + tag
        if len(payload) < JOIN_BELOW_BYTES:
            self.sock.sendall(header + payload)
        else:
            self.sock.sendall(header)
            self.sock.sendall(payload)

    def recv_bytes(self) -> memoryview:
        """Return the next frame's payload once its HMAC matched.

        Raises ``EOFError`` when the peer hung up between frames, :class:`WireError` for an
        oversize length (refused before reading on) or a bad HMAC.
        """
        head = _receive_exact(self.sock, _LENGTH.size, at_start=True)
        (length,) = _LENGTH.unpack(head)
        if length > MAX_MESSAGE_BYTES:
            raise WireError(f"a frame of {length} bytes is over the {MAX_MESSAGE_BYTES}-byte cap")
        body = memoryview(_receive_exact(self.sock, TAG_BYTES + length))
        tag, payload = body[:TAG_BYTES], body[TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(self._receive_mac, self._received, payload)):
            raise WireError("a frame failed its HMAC check")
        self._received += 1
        return payload

    @staticmethod
    def _tag(keyed: hmac.HMAC, sequence: int, payload: bytes | memoryview) -> bytes:
        """Return the HMAC (from the ``keyed`` state) of frame ``sequence`` carrying
        ``payload``."""
        mac = keyed.copy()
        mac.update(sequence.to_bytes(8, "big"))
        mac.update(payload)
        return mac.digest()

    def fileno(self) -> int:
        """Return the socket's file descriptor."""
        return self.sock.fileno()

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()


def _receive_exact(sock: socket.socket, size: int, at_start: bool = False) -> bytes:
    """Read exactly ``size`` bytes; EOF before the first byte of a frame (``at_start``) is
    ``EOFError``, EOF inside one a :class:`WireError`."""
    data = sock.recv(size)  # a whole small frame usually arrives at once
    if len(data) == size:
        return data
    buffer = bytearray(data)
    while len(buffer) < size:
        if not data:
            if at_start and not buffer:
                raise EOFError("the peer hung up")
            raise WireError(f"the peer hung up {len(buffer)} bytes into {size}")
        data = sock.recv(min(size - len(buffer), RECEIVE_CHUNK_BYTES))
        buffer += data
    return bytes(buffer)


class _Deadline:
    """One deadline for a whole handshake: every read gets only the time left."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock, self.end = sock, time.monotonic() + seconds

    def read(self, size: int) -> bytes:
        """Read ``size`` bytes before the deadline (``TimeoutError`` past it)."""
        data = b""
        while len(data) < size:
            left = self.end - time.monotonic()
            if left <= 0:
                raise TimeoutError("the handshake timed out")
            self.sock.settimeout(left)
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise EOFError(f"the peer hung up {len(data)} bytes into {size}")
            data += chunk
        return data

    def write(self, data: bytes) -> None:
        """Send ``data`` before the deadline."""
        self.sock.settimeout(max(self.end - time.monotonic(), 0.001))
        self.sock.sendall(data)


def _keys(key: bytes, server_nonce: bytes, client_nonce: bytes) -> tuple[bytes, bytes]:
    """Return this connection's (client-to-server, server-to-client) message keys."""
    return (
        _mac(key, b"client to server", server_nonce, client_nonce),
        _mac(key, b"server to client", server_nonce, client_nonce),
    )


def accept_handshake(sock: socket.socket, key: bytes, seconds: float) -> FramedSocket:
    """Run the server's side of the handshake on ``sock`` within ``seconds``.

    Raises :class:`WireError` for a wrong proof, ``TimeoutError``/``EOFError``/``OSError`` for a
    peer that stalls or hangs up; the caller closes ``sock``.
    """
    deadline = _Deadline(sock, seconds)
    server_nonce = secrets.token_bytes(NONCE_BYTES)
    deadline.write(MAGIC + server_nonce)
    answer = deadline.read(NONCE_BYTES + TAG_BYTES)
    client_nonce, proof = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
    if not hmac.compare_digest(proof, _mac(key, b"client proof", server_nonce, client_nonce)):
        raise WireError("the client's handshake proof is wrong (not the channel's key)")
    deadline.write(_mac(key, b"server proof", server_nonce, client_nonce))
    sock.settimeout(None)
    to_server, to_client = _keys(key, server_nonce, client_nonce)
    return FramedSocket(sock, send_key=to_client, receive_key=to_server)


def connect_handshake(sock: socket.socket, key: bytes, seconds: float) -> FramedSocket:
    """Run the client's side of the handshake on ``sock`` within ``seconds``.

    Raises :class:`ChannelBusy` when the server closed before its challenge,
    ``multiprocessing.AuthenticationError`` when it refused the key or did not prove it.
    """
    deadline = _Deadline(sock, seconds)
    try:
        challenge = deadline.read(len(MAGIC) + NONCE_BYTES)
    except (EOFError, ConnectionResetError) as exc:
        raise ChannelBusy("the channel closed before its challenge (busy)") from exc
    if challenge[: len(MAGIC)] != MAGIC:
        raise WireError("the peer does not speak the channel's protocol")
    server_nonce = challenge[len(MAGIC) :]
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    deadline.write(client_nonce + _mac(key, b"client proof", server_nonce, client_nonce))
    try:
        proof = deadline.read(TAG_BYTES)
    except (EOFError, ConnectionResetError) as exc:
        raise AuthenticationError("the channel refused the key") from exc
    if not hmac.compare_digest(proof, _mac(key, b"server proof", server_nonce, client_nonce)):
        raise AuthenticationError("the channel did not prove the key")
    sock.settimeout(None)
    to_server, to_client = _keys(key, server_nonce, client_nonce)
    return FramedSocket(sock, send_key=to_server, receive_key=to_client)
