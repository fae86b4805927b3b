"""NATS over TLS and mutual TLS, with certificates made by the openssl CLI for the test."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import nats
import pytest

from scaler.signals import connection, nats_core
from scaler.testing import nats_server

from .conftest import Eventually, ListSink, Start

SUBJECT = "scaler.signals.inference.llama-70b"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (EC P-256)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make test certificates")
    root = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=scaler test CA", cwd=root)
    (root / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (root / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=root)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                 "-extfile", f"{name}.ext", cwd=root)
    return root


async def _roundtrip(
    server: nats_server.NatsServer,
    settings: connection.NatsSettings,
    *,
    publisher_tls: ssl.SSLContext,
    start: Start,
    eventually: Eventually,
) -> ListSink:
    sink = ListSink()
    source = nats_core.NatsCoreSource(
        settings, nats_core.NatsCoreConfig(routes={SUBJECT: "inference/llama-70b"})
    )
    start(source.run(sink))
    await asyncio.wait_for(source.wait_ready(), 10)
    publisher = await nats.connect(settings.servers[0], tls=publisher_tls,
                                   allow_reconnect=False)
    try:
        body = {"v": 1, "model": "llama-70b", "ts": time.time(), "queue_depth": 2}
        await publisher.publish(SUBJECT, json.dumps(body).encode())
        await connection.barrier(publisher)
    finally:
        await publisher.close()
    await eventually(lambda: len(sink.samples) == 1)
    return sink


async def test_tls_with_a_private_ca(
    pki: Path, start: Start, eventually: Eventually
) -> None:
    tls_args = ("--tls", "--tlscert", str(pki / "server.pem"), "--tlskey", str(pki / "server.key"))
    with nats_server.NatsServer(jetstream=False, extra_args=tls_args) as server:
        settings = connection.NatsSettings(
            servers=(f"tls://127.0.0.1:{server.port}",),
            tls=connection.NatsTls(ca_file=pki / "ca.pem"),
        )
        publisher_tls = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        sink = await _roundtrip(server, settings, publisher_tls=publisher_tls, start=start,
                                eventually=eventually)
    assert sink.samples[0].value == 2.0


async def test_mutual_tls(pki: Path, start: Start, eventually: Eventually) -> None:
    tls_args = ("--tlsverify", "--tlscert", str(pki / "server.pem"),
                "--tlskey", str(pki / "server.key"), "--tlscacert", str(pki / "ca.pem"))
    with nats_server.NatsServer(jetstream=False, extra_args=tls_args) as server:
        tls = connection.NatsTls(
            ca_file=pki / "ca.pem", cert_file=pki / "client.pem", key_file=pki / "client.key"
        )
        settings = connection.NatsSettings(servers=(f"tls://127.0.0.1:{server.port}",),
                                           tls=tls)
        sink = await _roundtrip(server, settings, publisher_tls=tls.context(), start=start,
                                eventually=eventually)
    assert sink.samples[0].value == 2.0


async def test_untrusted_server_is_retried_not_raised(
    pki: Path, start: Start, eventually: Eventually, sink: ListSink
) -> None:
    tls_args = ("--tls", "--tlscert", str(pki / "server.pem"), "--tlskey", str(pki / "server.key"))
    with nats_server.NatsServer(jetstream=False, extra_args=tls_args) as server:
        # The system CAs do not know the test CA: every attempt fails verification.
        settings = connection.NatsSettings(
            servers=(f"tls://127.0.0.1:{server.port}",), tls=connection.NatsTls()
        )
        source = nats_core.NatsCoreSource(settings, nats_core.NatsCoreConfig())
        task = start(source.run(sink))
        await eventually(lambda: bool(source.stats.errors))
        assert not task.done() and not source.connected


def test_cert_and_key_go_together(pki: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        connection.NatsTls(cert_file=pki / "client.pem")
