"""Failed polls (Prometheus, JetStream): which targets fail now, and a rate-limited WARNING."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from scaler.signals import samples

LOG_INTERVAL_S = 60.0
"""At most one line per target per minute: a wrong URL with 100 models polled every 5 s
fails 1,200 times a minute, which would drown the log; 100 lines a minute, each with the
count since the previous one, still say what is wrong and how often."""


@dataclass(slots=True)
class _Streak:
    """The failures of one target since its last success."""

    failures: int = 0
    unlogged: int = 0
    logged_at: float | None = None


class PollFailures:
    """Tracks failing targets in `stats.failing` (so the source reports down) and logs them.

    The first failure of a target is logged at WARNING at once; later ones at most every
    `interval_s` seconds, with how many failed since the previous line; the first success
    after failures is logged once at INFO. `what` names the polls in the lines
    ("prometheus queries", "jetstream poll").
    """

    def __init__(self, stats: samples.SourceStats, *, what: str, logger: logging.Logger,
                 interval_s: float = LOG_INTERVAL_S) -> None:
        self._stats = stats
        self._what = what
        self._log = logger
        self._interval_s = interval_s
        self._streaks: dict[str, _Streak] = {}

    def failed(self, target: str, error: BaseException, *, now: float, detail: str = "",
               count: int = 1) -> None:
        """`count` polls (or queries) of `target` failed at `now` (seconds); `error` is one
        of them, `detail` says what was asked (a PromQL query, a consumer)."""
        self._stats.failing.add(target)
        streak = self._streaks.setdefault(target, _Streak())
        streak.failures += count
        streak.unlogged += count
        if streak.logged_at is not None and now - streak.logged_at < self._interval_s:
            return
        since = ("" if streak.logged_at is None
                 else f"; {streak.unlogged} failed since the previous line")
        self._log.warning("%s for %s failed: %s: %s%s%s", self._what, target,
                          type(error).__name__, error, f" ({detail})" if detail else "", since)
        streak.logged_at = now
        streak.unlogged = 0

    def succeeded(self, target: str) -> None:
        self._stats.failing.discard(target)
        streak = self._streaks.pop(target, None)
        if streak is not None:
            self._log.info("%s for %s succeed again, after %d failures", self._what, target,
                           streak.failures)

    def keep(self, targets: Iterable[str]) -> None:
        """Forget targets no longer configured (a removed policy is not failing)."""
        wanted = set(targets)
        self._streaks = {t: s for t, s in self._streaks.items() if t in wanted}
        self._stats.failing &= wanted
