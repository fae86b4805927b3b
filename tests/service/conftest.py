"""Fixtures of the service tests: a fake wall clock, certificates, running servers."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest

from scaler.service import tls

from . import factories


class FakeClock:
    """Wall clock for the service: tests move it by hand."""

    def __init__(self, now: float = factories.NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tls.CertificatePair:
    """One self-signed pair for the session (openssl takes ~50 ms; no need to repeat it)."""
    import asyncio

    directory = tmp_path_factory.mktemp("tls")
    return asyncio.run(tls.self_signed(directory, hosts=["localhost", "127.0.0.1"]))


@pytest.fixture
def client_ssl(certificate: tls.CertificatePair) -> ssl.SSLContext:
    """A client context that trusts only the test certificate (verification stays on)."""
    return ssl.create_default_context(cafile=str(certificate.cert_file))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session
