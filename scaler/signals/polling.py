"""The loop of a polling source (JetStream, Prometheus): what is due when, on the loop clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

_Target = TypeVar("_Target", bound=Hashable)


class PollSchedule(Generic[_Target]):
    """When each polled target is due next, on the event loop's clock (seconds).

    Shared by the polling sources (JetStream, Prometheus): a target is polled at once
    when first seen, then every `interval`; targets no longer configured are forgotten.
    """

    def __init__(self) -> None:
        self._due: dict[_Target, float] = {}

    def take_due(self, targets: Sequence[tuple[_Target, float]], now: float) -> list[_Target]:
        """The targets due at `now` (target, interval pairs); each is rescheduled."""
        wanted = {target for target, _ in targets}
        for gone in [t for t in self._due if t not in wanted]:
            del self._due[gone]
        due: list[_Target] = []
        for target, interval in targets:
            if self._due.setdefault(target, now) <= now:
                self._due[target] = now + interval
                due.append(target)
        return due

    def wait_s(self, now: float, *, idle_s: float = 3600.0) -> float:
        """Seconds until the next target is due (idle_s when there is none)."""
        return max(0.0, min((due - now for due in self._due.values()), default=idle_s))


class Poller(Generic[_Target]):
    """The loop of a polling source: poll what is due, sleep until the next is due.

    `wake()` (after a config update) re-reads the targets at once, so a new target is
    polled immediately and a removed one is no longer waited for.
    """

    def __init__(self) -> None:
        self._schedule: PollSchedule[_Target] = PollSchedule()
        self._changed = asyncio.Event()

    def wake(self) -> None:
        self._changed.set()

    async def run(
        self,
        targets: Callable[[], Sequence[tuple[_Target, float]]],
        poll_due: Callable[[list[_Target]], Awaitable[None]],
    ) -> None:
        """Until cancelled: `targets()` gives (target, interval s) pairs; `poll_due`
        polls the due ones and must not raise."""
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            due = self._schedule.take_due(targets(), loop.time())
            if due:
                await poll_due(due)
            wait = self._schedule.wait_s(loop.time())
            if wait > 0:
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=wait)
                except TimeoutError:
                    pass
