"""Turning an exception raised in a Ray worker into the reason the store records."""

from __future__ import annotations

import traceback

MAX_REASON_CHARS = 2000


def describe_failure(exc: BaseException) -> str:
    """Return the root cause's type and message (a Ray task error's ``cause``), bounded in length.

    The store keeps this per failed attempt, so it must name what went wrong without the
    remote traceback's noise.
    """
    cause = getattr(exc, "cause", None) or exc
    lines = traceback.format_exception_only(type(cause), cause)
    return "".join(lines).strip()[:MAX_REASON_CHARS]
