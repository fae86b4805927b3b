"""Time for the Kubernetes adapters: Time/MicroTime text <-> epoch, and the loop clock."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable

WallClock = Callable[[], float]
"""Epoch seconds; injected wherever a timestamp is written (time.time in production)."""


def rfc3339(epoch: float) -> str:
    """metav1.Time: whole seconds in UTC, e.g. 1764431282.9 -> '2025-11-29T15:48:02Z'."""
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(epoch: float) -> str:
    """metav1.MicroTime (Lease renewTime): '2025-11-29T15:48:02.900000Z'."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> float | None:
    """Epoch seconds from either form; None for missing or malformed values."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def loop_now(injected: Callable[[], float] | None) -> float:
    """Monotonic seconds: the injected clock (tests), else the running event loop's clock."""
    return injected() if injected is not None else asyncio.get_running_loop().time()
