"""Fixtures for the signal tests: real NATS and Prometheus servers, task cleanup, polling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any

import pytest

from scaler.core import backoff as core_backoff
from scaler.signals import connection, samples
from scaler.testing import nats_server, prometheus_server

Start = Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]
Eventually = Callable[..., Awaitable[None]]


class ListSink:
    """A sink that keeps every sample, in order (the seam between source and store)."""

    def __init__(self) -> None:
        self.samples: list[samples.Sample] = []

    def put(self, batch: Sequence[samples.Sample]) -> None:
        self.samples.extend(batch)

    def signals(self, model: str) -> dict[str, float | None]:
        """The latest value per signal for a model."""
        return {s.signal: s.value for s in self.samples if s.model == model}


@pytest.fixture
def sink() -> ListSink:
    return ListSink()


@pytest.fixture
def nats() -> Iterator[nats_server.NatsServer]:
    """A real nats-server with JetStream on a free loopback port, removed afterwards."""
    server = nats_server.NatsServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def nats_settings(nats: nats_server.NatsServer) -> connection.NatsSettings:
    # Fast reconnects: 50 ms doubling to at most 0.5 s, so a restart is noticed quickly.
    return connection.NatsSettings(
        servers=(nats.url,),
        reconnect=core_backoff.Backoff(base_delay_s=0.05, max_delay_s=0.5)
    )


@pytest.fixture
def prometheus_available() -> None:
    if prometheus_server.prometheus_binary() is None:
        pytest.skip(
            "no `prometheus` binary: install Debian's package (apt-get install prometheus) "
            "to run the Prometheus tests"
        )


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Start a background task; it is cancelled and awaited when the test ends."""
    tasks: list[asyncio.Task[None]] = []

    def starter(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        tasks.append(task)
        return task

    yield starter
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
def eventually() -> Eventually:
    """Await until `predicate()` is true, polling every 10 ms, failing after `timeout_s`."""

    async def wait(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate():
            if loop.time() > deadline:
                raise AssertionError(f"condition not met within {timeout_s} s")
            await asyncio.sleep(0.01)

    return wait


@pytest.fixture(autouse=True)
async def no_leftover_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running on the loop (every task must be stopped)."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()

    def running() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]

    # Tasks already cancelled by a client's close() need a few loop turns to finish:
    # give them up to 1 s (100 x 10 ms) before calling them leftovers.
    for _ in range(100):
        if not running():
            break
        await asyncio.sleep(0.01)
    left = running()
    for task in left:
        task.cancel()
    assert not left, f"tasks left running: {left}"
