"""The demo's virtual wall clock: the trace's time, running `speed` times faster than real time."""

from __future__ import annotations

from collections.abc import Callable


class VirtualClock:
    """The service's wall clock: `start_epoch + speed x (loop time since begin())`.

    Frozen at `start_epoch` until `begin()`, so the service's start-up (policy load, first
    evaluation) happens at the trace's first instant. `loop_time` is the event loop's
    monotonic clock (`loop.time`), which is safe to read from worker threads too. When
    the simulation cannot keep up (a busy machine, a high speed), `hold_back` slows the
    clock instead of letting replicas' reports arrive stale; it never runs backwards.
    """

    def __init__(self, *, loop_time: Callable[[], float], start_epoch: float,
                 speed: float) -> None:
        self.loop_time = loop_time
        self.start_epoch = start_epoch
        self.speed = speed
        self.held_back_s = 0.0
        self._origin: float | None = None
        self._floor = 0.0

    def begin(self) -> None:
        self._origin = self.loop_time()

    def _raw(self) -> float:
        if self._origin is None:
            return 0.0
        return self.speed * (self.loop_time() - self._origin)

    def elapsed(self) -> float:
        """Virtual seconds since begin(), never less than a value already returned."""
        self._floor = max(self._floor, self._raw())
        return self._floor

    def hold_back(self, *, limit: float) -> None:
        """Move the clock's origin so that it reads at most `limit` (virtual seconds) now;
        readings already given stay (the clock pauses until it passes them again)."""
        excess = self._raw() - limit
        if excess > 0 and self._origin is not None:
            self._origin += excess / self.speed
            self.held_back_s += excess

    def __call__(self) -> float:
        return self.start_epoch + self.elapsed()
