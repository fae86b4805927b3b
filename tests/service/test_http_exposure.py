"""The plain HTTP port can speak TLS, and push can have a port of its own.

A real Service (a fake cluster behind its seams, NATS pointed nowhere) with `http.cert_file`
and `http.push_port` set: /healthz answers over TLS only, and POST /v1/signals lives on
the push port only, so a NetworkPolicy can admit scrapers and publishers separately.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import aiohttp

from scaler import testing
from scaler.actuators import base as actuators
from scaler.service import runner, settings, tls

from . import fakes
from .conftest import FakeClock

POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {name: m, namespace: ns}
spec:
  target: {name: m}
  replicas: {min: 1, max: 4}
  signals:
    concurrency: {targetPerReplica: 10}
"""


async def test_tls_on_the_http_port_and_push_on_its_own(
    tmp_path: Path, clock: FakeClock
) -> None:
    (tmp_path / "m.yaml").write_text(POLICY)
    pair = await tls.self_signed(tmp_path, hosts=["127.0.0.1"])
    config = settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(servers=(f"nats://127.0.0.1:{testing.free_port()}",)),
        "http": settings.HttpSettings(host="127.0.0.1", port=0, push_port=0,
                                      push_token="secret", cert_file=pair.cert_file,
                                      key_file=pair.key_file),
        "metrics_api": settings.MetricsApiSettings(enabled=False),
        "policies": settings.PolicySettings(paths=[tmp_path]),
    })
    cluster = fakes.FakeCluster(current=1)
    service = runner.Service(config, wall_clock=clock, backend=runner.ClusterBackend(
        reader=cluster, actuator=cluster, leader=actuators.AlwaysLeader()))
    trust = ssl.create_default_context(cafile=str(pair.cert_file))
    try:
        await service.start()
        assert service.http is not None and service.push_server is not None
        assert service.http.url.startswith("https://")
        assert service.push_server.port != service.http.port
        async with aiohttp.ClientSession() as http:
            async with http.get(service.http.url + "/healthz", ssl=trust) as response:
                assert response.status == 200
            # Plain HTTP to the TLS port gets no answer.
            plain = service.http.url.replace("https://", "http://") + "/healthz"
            try:
                async with http.get(plain) as response:
                    answered = response.status
            except aiohttp.ClientError:
                answered = None
            assert answered != 200
            body = json.dumps({"v": 1, "model": "m", "namespace": "ns", "ts": clock.now,
                               "in_flight": 3})
            headers = {"Authorization": "Bearer secret"}
            async with http.post(service.push_server.url + "/v1/signals", data=body,
                                 headers=headers, ssl=trust) as response:
                assert response.status == 202
                assert (await response.json())["accepted"] == 1
            async with http.post(service.http.url + "/v1/signals", data=body,
                                 headers=headers, ssl=trust) as response:
                assert response.status in (404, 405)
    finally:
        await service.stop()
