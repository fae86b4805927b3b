"""Suite-wide fixtures: fail any test that leaves asyncio tasks running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def _no_leaked_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """A test must stop every task it starts (as kopf's suite insists)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - sync tests run without a loop
        yield
        return
    before = asyncio.all_tasks(loop)
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks(loop) - before
              if not t.done() and t is not asyncio.current_task()]
    if leaked:
        for task in leaked:
            task.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        names = ", ".join(sorted(t.get_name() for t in leaked))
        pytest.fail(f"test left tasks running: {names}")
