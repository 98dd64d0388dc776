"""This driver's shard leases: its identity, the lease timing, and the heartbeat that renews them.

A driver leases each shard it runs in the store (``Store.claim_shard``) for ``lease_s``
seconds and renews every lease it holds each ``heartbeat_s`` seconds while it runs; when it
ends (or is interrupted) it releases them. A driver killed outright stops renewing, so its
leases lapse ``lease_s`` seconds after its last heartbeat and the next ``submit`` (or a driver
waiting on them) takes its shards over. ``SPECSWEEP_LEASE_SECONDS`` and
``SPECSWEEP_HEARTBEAT_SECONDS`` override the defaults (tests shorten them).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

from orchestrator.store import Store
from orchestrator.store.records import LeaseHolder

#: Seconds a shard's lease lasts without a heartbeat: how long a killed driver's shards wait.
LEASE_SECONDS = 30.0
#: Seconds between heartbeats (and between a waiting driver's looks at a leased shard).
HEARTBEAT_SECONDS = 5.0
LEASE_ENV = "SPECSWEEP_LEASE_SECONDS"
HEARTBEAT_ENV = "SPECSWEEP_HEARTBEAT_SECONDS"


class LeaseSettingError(ValueError):
    """A lease timing from the environment is not a usable number of seconds."""


@dataclass(frozen=True)
class LeaseTiming:
    """How long a shard lease lasts (``lease_s``) and how often it is renewed (``heartbeat_s``).

    The heartbeat must come well within the lease: at most a third of it, so one late
    heartbeat does not let a live driver's lease lapse.
    """

    lease_s: float = LEASE_SECONDS
    heartbeat_s: float = HEARTBEAT_SECONDS

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s <= self.lease_s / 3:
            raise LeaseSettingError(
                f"{HEARTBEAT_ENV}={self.heartbeat_s:g} must be above 0 and at most a third of "
                f"{LEASE_ENV}={self.lease_s:g}; set both, e.g. 30 and 5"
            )


def lease_timing(environ: Mapping[str, str] = os.environ) -> LeaseTiming:
    """Return the lease timing: the defaults, overridden by the environment variables."""
    return LeaseTiming(
        lease_s=_seconds(environ, LEASE_ENV, LEASE_SECONDS),
        heartbeat_s=_seconds(environ, HEARTBEAT_ENV, HEARTBEAT_SECONDS),
    )


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """Return the positive number of seconds in ``environ[name]``, else ``default``."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise LeaseSettingError(f"{name}={text!r} is not a positive number of seconds")
    return value


def this_driver() -> LeaseHolder:
    """Return a new identity for this driver process: a random id and its ``host:pid``."""
    return LeaseHolder(driver_id=uuid.uuid4().hex, name=f"{socket.gethostname()}:{os.getpid()}")


@dataclass
class Heartbeat:
    """A thread renewing ``holder``'s shard leases every ``timing.heartbeat_s`` seconds while
    the ``with`` block runs; on leaving it, it stops and releases them.

    A failed renewal (the database briefly unreachable) is reported on stderr and retried at
    the next beat; leases lapse only after ``timing.lease_s`` seconds without one.
    """

    store: Store
    holder: LeaseHolder
    timing: LeaseTiming
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.store.release_leases(self.holder)
        except Exception as error:  # unreleased leases lapse on their own: never mask an error
            print(f"warning: releasing shard leases failed: {error}", file=sys.stderr)

    def _beat(self) -> None:
        """Renew the leases each heartbeat until stopped."""
        while not self._stop.wait(self.timing.heartbeat_s):
            try:
                self.store.renew_leases(self.holder, self.timing.lease_s)
            except Exception as error:  # the next beat retries; the lease outlasts a few misses
                print(f"warning: renewing shard leases failed: {error}", file=sys.stderr)
