"""Retry backoff, defined once: a settings model and a pure delay schedule, jitter as data.

Used by the Kubernetes client's retries (`kube.retry`) and the NATS reconnects
(`nats.reconnect`). The random draw is an argument, so the schedule is a pure function a
table test can pin, and callers own their random generator (a seeded one in tests).
"""

from __future__ import annotations

from pydantic import Field

from scaler.core import settings

# 2**62 times any positive base already exceeds every sane cap; clamping the exponent keeps
# `2.0 ** retry` finite for a retry counter that has grown for days (2**1024 overflows).
_MAX_EXPONENT = 62


class Backoff(settings.Group):
    """Exponential backoff with jitter: the wait before retry n (n = 1 for the first retry) is

        step  = min(max_delay_s, base_delay_s * 2**(n - 1))
        delay = step * (1 - jitter_ratio * (1 - jitter)),   jitter drawn uniformly in [0, 1]

    so each delay lies in [(1 - jitter_ratio) * step, step] and never exceeds max_delay_s.
    The defaults (0.25 s, 10 s, 0.5) wait 0.125-0.25, 0.25-0.5, 0.5-1, 1-2 s, ... up to
    5-10 s. One default for every retry loop: a partial override (one field in the
    environment) keeps the others, and there is one schedule to reason about.
    """

    base_delay_s: float = Field(
        default=0.25, gt=0,
        description="Wait before the first retry, seconds. 0.25 s: a dropped connection "
        "or a briefly overloaded server often recovers within that.",
    )
    max_delay_s: float = Field(
        default=10.0, gt=0,
        description="Longest wait between two attempts, seconds (the doubling stops here; "
        "jitter only shortens it). 10 s: a server back from a restart is found within 10 s, "
        "and a fleet of clients asks at most once per 5-10 s each meanwhile.",
    )
    jitter_ratio: float = Field(
        default=0.5, ge=0, le=1,
        description="Share of each delay that is random: a delay lies in "
        "[(1 - ratio) x step, step]. 0.5 is AWS's 'equal jitter': half fixed, half random, "
        "so many clients do not retry in lock-step; 0 = no jitter.",
    )


def delay_s(backoff: Backoff, *, retry: int, jitter: float) -> float:
    """Seconds to wait before retry `retry` (1 = first retry; lower counts as 1).

    `jitter` is the random draw in [0, 1] (clamped): 1 gives the full step, 0 the shortest
    delay. Base 0.25 s, cap 10 s, ratio 0.5: retry 4 -> step 2 s -> 1 to 2 s.
    """
    exponent = min(max(retry, 1) - 1, _MAX_EXPONENT)
    step = min(backoff.max_delay_s, backoff.base_delay_s * 2.0 ** exponent)
    draw = min(1.0, max(0.0, jitter))
    return step * (1.0 - backoff.jitter_ratio * (1.0 - draw))
