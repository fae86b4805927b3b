"""GPU health and SM activity from dcgm-exporter's series, through a real Prometheus."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from scaler.actuators import gpu_health, timeline
from scaler.signals import prometheus
from scaler.testing import free_port, prometheus_server

pytestmark = pytest.mark.usefixtures("prometheus_available")

NOW = 1_764_400_000.0


class DcgmExporter:
    """dcgm-exporter's text format, with its labels (gpu, UUID, device, modelName,
    Hostname; pod and namespace where the Kubernetes mapping names the pod using the GPU).
    The double-bit ECC counter of gpu-4's GPU 1 grows by one every scrape."""

    def __init__(self) -> None:
        self.scrapes = 0

    def render(self) -> str:
        self.scrapes += 1
        lines = ["# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
                 "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
                 "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge"]
        xids = {("gpu-3", 5): 79, ("gpu-3", 6): 79, ("gpu-2", 0): 13}  # 13: the app's fault
        for node in ("gpu-2", "gpu-3", "gpu-4"):
            for index in range(8):
                labels = (f'gpu="{index}",UUID="GPU-{node}-{index}",device="nvidia{index}",'
                          f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"')
                lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xids.get((node, index), 0)}")
                dbe = self.scrapes if (node, index) == ("gpu-4", 1) else 0
                lines.append(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels}}} {dbe}")
        for pod, value in (("llama-a", 0.5), ("llama-b", 0.3)):
            for index in (0, 1):
                labels = (f'gpu="{index}",UUID="GPU-gpu-2-{index}",Hostname="gpu-2",'
                          f'namespace="inference",pod="{pod}",container="vllm"')
                lines.append(f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} {value + index * 0.1}")
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prom() -> Iterator[prometheus_server.PrometheusServer]:
    exporter = DcgmExporter()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            body = exporter.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="dcgm-exporter", daemon=True).start()
    prom = prometheus_server.PrometheusServer(targets=[f"127.0.0.1:{port}"])
    prom.start()
    try:
        # increase() needs two samples of the counter: wait until it shows.
        prom.wait_for("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1m]) > 0")
        yield prom
    finally:
        prom.close()
        server.shutdown()
        server.server_close()


async def test_faulty_gpus_are_read_by_node_with_their_reason(
        prom: prometheus_server.PrometheusServer) -> None:
    now = [NOW]
    settings = prometheus.PrometheusSettings(url=prom.url, dcgm=prometheus.DcgmSettings(
        enabled=True, health_window="1m", max_age_s=60))
    poller = prometheus.GpuTelemetryPoller(settings, clock=lambda: now[0])
    try:
        reading = await poller.poll()
    finally:
        poller.close()
    assert reading is not None and poller.latest() == reading
    now[0] += 61  # older than max_age_s: no longer believed
    assert poller.latest() is None
    assert [(f.node, f.gpu, f.reason) for f in reading.faults] == [
        ("gpu-3", "5", "XID 79"), ("gpu-3", "6", "XID 79"), ("gpu-4", "1", "double-bit ECC")]
    assert reading.faults[0].uuid == "GPU-gpu-3-5"
    assert reading.gpus_per_node == {"gpu-2": 8, "gpu-3": 8, "gpu-4": 8}
    assert reading.sm_active == {("inference", "llama-a"): pytest.approx(0.55),
                                 ("inference", "llama-b"): pytest.approx(0.35)}

    # The same reading takes the GPUs out of the nodes' capacity and says why.
    nodes = [timeline.NodeInfo(name=n, labels={}, ready=True, cordoned=False,
                               allocatable={"nvidia.com/gpu": 8}, created_at=None)
             for n in ("gpu-2", "gpu-3", "gpu-4")]
    counted, exclusions = gpu_health.exclude_faulty(nodes, reading,
                                                    resource_name="nvidia.com/gpu")
    assert [n.allocatable["nvidia.com/gpu"] for n in counted] == [8, 6, 7]
    assert [e.text for e in exclusions] == [
        "node gpu-3: 2 of 8 GPUs excluded: XID 79 on GPU 5, 6",
        "node gpu-4: 1 of 8 GPUs excluded: double-bit ECC on GPU 1"]


async def test_a_failed_poll_is_counted_not_raised() -> None:
    dead = prometheus.PrometheusSettings(url=f"http://127.0.0.1:{free_port()}", timeout_s=0.5,
                                         dcgm=prometheus.DcgmSettings(enabled=True))
    poller = prometheus.GpuTelemetryPoller(dead, clock=lambda: NOW)
    assert await poller.poll() is None
    assert poller.latest() is None
    assert poller.stats.errors and not poller.stats.up
