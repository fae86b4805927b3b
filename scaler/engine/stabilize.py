"""HPA-semantics stabilization windows and rate-limit policies (DESIGN 3.3), time-keyed."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scaler.engine import types
from scaler.policy import model


def stabilize(
    behavior: model.Behavior,
    *,
    current: int,
    recommendation: int,
    history: Sequence[types.Recommendation],
    now: float,
    down_window_s: float | None = None,
) -> int:
    """The HPA's stabilization: up to the lowest recommendation of the up window, down to
    the highest of the down window, each window including the new recommendation.
    `down_window_s` replaces the behavior's down window (restart-aware holding).

    Example with a 300 s down window: recommendations 10 (at t=0), 4 (t=100), 3 (t=200)
    and current 10 give 10 until t=300, then 4 until t=400, then 3.
    """
    if down_window_s is None:
        down_window_s = behavior.scale_down.stabilization_seconds
    up_cutoff = now - behavior.scale_up.stabilization_seconds
    down_cutoff = now - down_window_s
    up = down = recommendation
    # Comparisons, not min() and max(): the same counts, two calls fewer an entry of a
    # window that holds 60 at one decision per 5 s and 300 at one a second.
    for past in history:
        replicas = past.replicas
        if past.at > up_cutoff and replicas < up:
            up = replicas
        if past.at > down_cutoff and replicas > down:
            down = replicas
    result = current
    if result < up:
        result = up
    if result > down:
        result = down
    return result


def _changes_in_period(events: Sequence[types.ScaleEvent], *, period_s: int, now: float,
                       up: bool) -> int:
    cutoff = now - period_s
    return sum([  # a list, not a generator: the same sum, no generator object
        abs(e.delta) for e in events if e.at > cutoff and (e.delta > 0) == up and e.delta != 0
    ])


def rate_limit(
    direction: model.ScalingDirection,
    *,
    up: bool,
    current: int,
    events: Sequence[types.ScaleEvent],
    now: float,
) -> int | None:
    """The furthest count the direction's policies allow now (None = unlimited).

    Each policy starts from the count at the start of its period (current, less what was
    added in it, plus what was removed in it). Up: Pods adds `value`, Percent multiplies by
    (1 + value/100) rounded up. Down: Pods removes `value`, Percent keeps (1 - value/100),
    truncated, as the HPA does. selectPolicy Max takes the policy allowing the biggest
    change, Min the smallest, Disabled none.
    Examples: up with Pods 4 / 60 s and Percent 100 / 60 s at 3 replicas, +2 already this
    minute: start 1 -> max(1 + 4, ceil(1 x 2)) = 5. Down with Percent 20 / 60 s at 10
    replicas, nothing removed this minute -> 8.
    """
    if direction.select_policy == "Disabled":
        return current
    if not direction.policies:
        return None
    proposals = []
    for rule in direction.policies:
        added = _changes_in_period(events, period_s=rule.period_seconds, now=now, up=True)
        removed = _changes_in_period(events, period_s=rule.period_seconds, now=now, up=False)
        start = current - added + removed
        if rule.type == "Pods":
            proposals.append(start + rule.value if up else start - rule.value)
        elif up:
            proposals.append(math.ceil(start * (1 + rule.value / 100)))
        else:
            proposals.append(int(start * (1 - rule.value / 100)))
    most_change = max if up else min
    least_change = min if up else max
    return (most_change if direction.select_policy == "Max" else least_change)(proposals)
