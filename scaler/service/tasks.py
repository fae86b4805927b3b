"""Supervised background tasks: one guarded start helper, ordered stop with timeouts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """A supervised task that ended on its own: with an exception, or (for a task meant to
    run until cancelled) without one."""

    name: str
    error: str


class Supervisor:
    """Starts every long-running task through `start`, which names it and logs its end.

    An `essential` task runs until cancelled (a signal source, the reactor, the Lease):
    if it ends by itself, `failed` is set so the service can exit non-zero instead of
    running on with a silent hole. Tasks stop in reverse start order unless the caller
    stops some first by name (sources before the reactor, so no sample is half-handled).
    """

    def __init__(self, *, stop_timeout_s: float = 5.0) -> None:
        self.stop_timeout_s = stop_timeout_s
        self.failed = asyncio.Event()
        self.failures: list[TaskFailure] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._work: dict[str, Coroutine[Any, Any, None]] = {}
        self._stopping: set[str] = set()

    def start(
        self, name: str, work: Coroutine[Any, Any, None], *, essential: bool = True
    ) -> asyncio.Task[None]:
        if name in self._tasks and not self._tasks[name].done():
            work.close()
            raise ValueError(f"a task named {name!r} is already running")
        task = asyncio.get_running_loop().create_task(self._guard(name, work, essential),
                                                      name=name)
        self._tasks[name] = task
        self._work[name] = work
        self._stopping.discard(name)
        return task

    async def _guard(self, name: str, work: Coroutine[Any, Any, None], essential: bool) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("task %s failed", name)
            self._fail(name, f"{type(error).__name__}: {error}", essential)
        else:
            if essential and name not in self._stopping:
                log.error("task %s ended although it should run until stopped", name)
                self._fail(name, "ended unexpectedly", essential)

    def _fail(self, name: str, error: str, essential: bool) -> None:
        if name in self._stopping:
            return  # it was asked to stop: however it ends, that is not a failure
        self.failures.append(TaskFailure(name=name, error=error))
        if essential:
            self.failed.set()

    @property
    def names(self) -> list[str]:
        """Running tasks, in start order."""
        return [name for name, task in self._tasks.items() if not task.done()]

    async def stop(self, name: str, *, timeout_s: float | None = None) -> bool:
        """Cancel one task and wait up to the timeout; False if it did not stop in time."""
        task = self._tasks.pop(name, None)
        work = self._work.pop(name, None)
        if task is None:
            return True
        self._stopping.add(name)
        if not task.done():
            task.cancel()
        limit = self.stop_timeout_s if timeout_s is None else timeout_s
        done, _ = await asyncio.wait({task}, timeout=limit)
        if not done:
            log.warning("task %s did not stop within %.1f s", name, limit)
            return False
        if work is not None:
            # A task cancelled before its first step never started `work`: close it, or
            # Python warns that the coroutine was never awaited. A no-op once it ran.
            work.close()
        return True

    async def stop_all(self) -> bool:
        """Stop the remaining tasks, newest first. True when every one stopped in time."""
        stopped = True
        for name in reversed(list(self._tasks)):
            stopped = await self.stop(name) and stopped
        return stopped
