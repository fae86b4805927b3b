"""Watch bookmarks on the real server's schedule: every minute and once 2 s before the
timeout, not every second."""

from __future__ import annotations

import asyncio
import json

import pytest

from scaler.emulator import EmulatorOptions
from tests.emulator.conftest import NS, Http


async def watch_types(http: Http, *, timeout_s: str) -> list[tuple[str, float]]:
    """(event type, seconds since the watch began) of every event of one watch."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    seen: list[tuple[str, float]] = []
    async with http.session.get(
            f"{http.url}/api/v1/namespaces/{NS}/pods",
            params={"watch": "1", "allowWatchBookmarks": "true",
                    "timeoutSeconds": timeout_s}) as response:
        async for line in response.content:
            seen.append((json.loads(line)["type"], loop.time() - start))
    return seen


async def test_one_bookmark_shortly_before_the_timeout(http: Http) -> None:
    # 60 s apart by default, so a 3 s watch gets one, 2 s before its end (at 1 s), and a
    # 1 s watch none at all.
    seen, short = await asyncio.gather(watch_types(http, timeout_s="3"),
                                       watch_types(http, timeout_s="1"))
    assert [kind for kind, _ in seen] == ["BOOKMARK"]
    assert 0.9 <= seen[0][1] < 2.0
    assert short == []


@pytest.mark.parametrize("options", [EmulatorOptions(bookmark_interval_s=0.2)])
async def test_bookmarks_come_at_the_interval_when_it_is_shorter(http: Http) -> None:
    seen = await watch_types(http, timeout_s="3")
    # 0.2, 0.4 ... 1.0 (the last one 2 s before the end), then silence until 3 s.
    assert [kind for kind, _ in seen] == ["BOOKMARK"] * 5
    assert seen[-1][1] < 2.0
