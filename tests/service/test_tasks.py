"""The supervisor: named tasks, failures noticed, ordered stop with timeouts."""

from __future__ import annotations

import asyncio

import pytest

from scaler.service import tasks


async def forever() -> None:
    await asyncio.Future()


async def test_a_failing_essential_task_sets_failed() -> None:
    supervisor = tasks.Supervisor()

    async def broken() -> None:
        raise RuntimeError("lost the connection for good")

    supervisor.start("source:nats", broken())
    supervisor.start("reactor", forever())
    await asyncio.wait_for(supervisor.failed.wait(), timeout=5)
    assert supervisor.failures == [tasks.TaskFailure(
        name="source:nats", error="RuntimeError: lost the connection for good")]
    assert supervisor.names == ["reactor"]
    assert await supervisor.stop_all()


async def test_an_essential_task_that_returns_is_a_failure_but_others_may_return() -> None:
    supervisor = tasks.Supervisor()

    async def done() -> None:
        return None

    supervisor.start("one-shot", done(), essential=False)
    supervisor.start("leader", done())
    await asyncio.wait_for(supervisor.failed.wait(), timeout=5)
    assert [f.name for f in supervisor.failures] == ["leader"]
    assert await supervisor.stop_all()


async def test_stop_order_and_timeout() -> None:
    supervisor = tasks.Supervisor(stop_timeout_s=0.05)
    stopped: list[str] = []
    release = asyncio.Event()

    async def tidy(name: str) -> None:
        try:
            await asyncio.Future()
        finally:
            stopped.append(name)

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # refuses to stop until released

    supervisor.start("a", tidy("a"))
    supervisor.start("b", tidy("b"))
    late = supervisor.start("stubborn", stubborn())
    supervisor.start("c", tidy("c"))
    await asyncio.sleep(0)  # let every task reach its first await
    try:
        assert await supervisor.stop("b")
        assert not await supervisor.stop("stubborn")  # reported, not awaited forever
        assert await supervisor.stop_all()
        assert stopped == ["b", "c", "a"]
    finally:
        release.set()
        await asyncio.wait({late}, timeout=5)


async def test_names_are_unique_while_running() -> None:
    supervisor = tasks.Supervisor()
    supervisor.start("reactor", forever())
    with pytest.raises(ValueError, match="already running"):
        supervisor.start("reactor", forever())
    await supervisor.stop_all()


async def test_stopping_before_the_first_step_leaves_no_unawaited_coroutine() -> None:
    supervisor = tasks.Supervisor()
    supervisor.start("quick", forever())
    assert await supervisor.stop("quick")  # filterwarnings=error would fail on the warning
    assert supervisor.failures == []
