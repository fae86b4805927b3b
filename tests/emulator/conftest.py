"""Fixtures: the emulator as tests meet it (status writer on) and a raw HTTP client, so
tests see the exact status codes, headers and bodies a real kube-apiserver sends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from scaler.emulator import EmulatorOptions, KubeEmulator
from scaler.emulator.env import ManualClock

NS = "ns"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    content_type: str
    text: str

    @property
    def body(self) -> Any:
        return json.loads(self.text)


@dataclass(slots=True)
class Http:
    """Requests to the emulator with a chosen Content-Type and the raw answer back."""

    session: aiohttp.ClientSession
    url: str

    async def call(self, method: str, path: str, body: Any = None, *,
                   content_type: str = "application/json",
                   query: dict[str, str] | None = None) -> Answer:
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(method, self.url + path, data=data, headers=headers,
                                        params=query) as response:
            return Answer(response.status, response.headers.get("Content-Type", ""),
                          await response.text())

    async def ok(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        answer = await self.call(method, path, body, **kwargs)
        assert answer.status < 300, answer.text
        return answer.body


def deployment(name: str, replicas: int = 1, **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {"metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "i:1"}]}},
                     **spec}}


async def eventually(probe: Callable[[], Any], *, timeout_s: float = 2.0) -> Any:
    """Poll `probe` (a coroutine function) until it returns something truthy."""
    async with asyncio.timeout(timeout_s):
        while not (result := await probe()):
            await asyncio.sleep(0.005)
        return result


@pytest.fixture
def wall_clock() -> ManualClock:
    return ManualClock(1_764_400_000.0)


@pytest.fixture
def options() -> EmulatorOptions:
    return EmulatorOptions(status_writer=True)


@pytest.fixture
async def emulator(wall_clock: ManualClock, options: EmulatorOptions
                   ) -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator(clock=wall_clock, options=options) as emu:
        emu.ensure_namespace(NS)
        yield emu


@pytest.fixture
async def http(emulator: KubeEmulator) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession(headers={"User-Agent": "fidelity-test/1.0"}) as session:
        yield Http(session, emulator.url)
