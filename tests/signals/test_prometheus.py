"""Prometheus presets against a real Prometheus scraping a vLLM-style exporter on loopback."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from scaler.core import histogram, vocabulary
from scaler.policy import model as policy_model
from scaler.signals import prometheus
from scaler.testing import free_port, prometheus_server

from .conftest import ListSink, Start

KEY = "inference/llama"
SCRAPE_S = 0.5
WINDOW = "3s"  # 6 scrapes: rate() is exact for a linear counter once the window is full

# Per-second increments of cumulative buckets, per pod. TTFT bounds 0.1 .. 2.5 s, then +Inf.
TTFT_LE = (0.1, 0.25, 0.5, 1, 2.5)
TTFT_A = (2, 6, 10, 14, 20, 20)
TTFT_B = (0, 1, 3, 5, 10, 10)
E2E_LE = (1, 5, 10)
E2E_A = (4, 8, 10, 10)


def _buckets(name: str, labels: str, le: tuple[float, ...], per_s: tuple[int, ...],
             elapsed: float) -> list[str]:
    bounds = [str(b) for b in le] + ["+Inf"]
    return [f'{name}{{{labels},le="{b}"}} {n * elapsed}' for b, n in zip(bounds, per_s,
                                                                         strict=True)]


class Exporter:
    """Serves /metrics in the text format: gauges fixed, counters linear in time."""

    def __init__(self) -> None:
        self.started = time.time()

    def render(self) -> str:
        t = time.time() - self.started
        a, b = 'model_name="llama",pod="a"', 'model_name="llama",pod="b"'
        lines = [
            f"vllm:num_requests_waiting{{{a}}} 5",
            f"vllm:num_requests_waiting{{{b}}} 3",
            f"vllm:num_requests_running{{{a}}} 10",
            f"vllm:num_requests_running{{{b}}} 6",
            f"vllm:kv_cache_usage_perc{{{a}}} 0.5",
            f"vllm:kv_cache_usage_perc{{{b}}} 0.7",
            f"vllm:generation_tokens_total{{{a}}} {100 * t}",
            f"vllm:generation_tokens_total{{{b}}} {50 * t}",
            f"vllm:prompt_tokens_total{{{a}}} {2000 * t}",
            f"vllm:prompt_tokens_total{{{b}}} {1000 * t}",
            f'vllm:request_success_total{{{a},finished_reason="stop"}} {8 * t}',
            f'vllm:request_success_total{{{a},finished_reason="length"}} {2 * t}',
            f"vllm:request_success_total{{{b}}} {5 * t}",
            *_buckets("vllm:time_to_first_token_seconds_bucket", a, TTFT_LE, TTFT_A, t),
            *_buckets("vllm:time_to_first_token_seconds_bucket", b, TTFT_LE, TTFT_B, t),
            *_buckets("vllm:e2e_request_latency_seconds_bucket", a, E2E_LE, E2E_A, t),
            # A model with no traffic: NaN gauges and histograms that never move.
            'vllm:num_requests_waiting{model_name="idle"} NaN',
            *_buckets("vllm:time_to_first_token_seconds_bucket", 'model_name="idle"',
                      TTFT_LE, TTFT_A, 1.0),
            f"sglang:num_queue_reqs{{{a}}} 7",
            f"sglang:num_running_reqs{{{a}}} 9",
            f"sglang:gen_throughput{{{a}}} 321.5",
            f"sglang:prompt_tokens_total{{{a}}} {400 * t}",
            f"sglang:num_requests_total{{{a}}} {3 * t}",
            f"sglang:token_usage{{{a}}} 0.28",
            *_buckets("sglang:time_to_first_token_seconds_bucket", a, TTFT_LE, TTFT_A, t),
            f"tgi_queue_size{{{a}}} 2",
            f"tgi_batch_current_size{{{a}}} 4",
            f"tgi_request_success{{{a}}} {2 * t}",
            *_buckets("tgi_request_duration_bucket", a, E2E_LE, E2E_A, t),
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{namespace="inference",pod="llama-0"} 0.8',
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{namespace="inference",pod="llama-1"} 0.4',
            'DCGM_FI_PROF_SM_ACTIVE{namespace="inference",pod="llama-0"} 0.5',
            'DCGM_FI_PROF_SM_ACTIVE{namespace="inference",pod="llama-1"} 0.3',
            'DCGM_FI_DEV_FB_USED{namespace="inference",pod="llama-0"} 1000',
            'DCGM_FI_DEV_FB_USED{namespace="inference",pod="llama-1"} 3000',
        ]
        return "\n".join(lines) + "\n"


def _serve(exporter: Exporter, port: int, slow_s: float) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path.startswith("/slow"):
                time.sleep(slow_s)  # a Prometheus that does not answer in time
            body = exporter.render().encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the slow path's client gave up, as intended

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="exporter", daemon=True).start()
    return server


@pytest.fixture(scope="module")
def exporter_port() -> Iterator[int]:
    port = free_port()
    server = _serve(Exporter(), port, slow_s=1.0)
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def prom(exporter_port: int) -> Iterator[prometheus_server.PrometheusServer]:
    """A real Prometheus scraping the exporter every 0.5 s, with a full 3 s rate window."""
    if prometheus_server.prometheus_binary() is None:
        pytest.skip(
            "no `prometheus` binary: install Debian's package (apt-get install prometheus) "
            "to run the Prometheus tests"
        )
    server = prometheus_server.PrometheusServer(
        targets=[f"127.0.0.1:{exporter_port}"], scrape_interval_s=SCRAPE_S
    )
    server.start()
    try:
        server.wait_for(
            f'count_over_time(vllm:generation_tokens_total{{pod="a"}}[{WINDOW}]) >= 6',
            timeout_s=30,
        )
        yield server
    finally:
        server.close()


def policy(preset: str, name: str = "llama", metric: str = "ttft",
           queries: dict[str, str] | None = None) -> policy_model.ScalePolicy:
    return policy_model.ScalePolicy.model_validate(
        {
            "apiVersion": "scaler.io/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": name, "namespace": "inference"},
            "spec": {
                "target": {"name": name}, "replicas": {"max": 4},
                "signals": {"concurrency": {"targetPerReplica": 8},
                            "p95Latency": {"metric": metric, "sloSeconds": 2}},
                "sources": {"prometheus": {"preset": preset, "queries": queries or {}}},
            },
        }
    )


async def poll(source: prometheus.PrometheusSource, target: prometheus.PromTarget | None,
               sink: ListSink) -> dict[str, float | None]:
    assert target is not None
    await source.poll(target, sink, limit=asyncio.Semaphore(4))
    return sink.signals(target.model)


# --- pure parts -----------------------------------------------------------------------


def test_vllm_preset_queries() -> None:
    target = prometheus.target_from_policy(policy("vllm"))
    assert target is not None and target.model == KEY
    assert dict(target.queries) == {
        "queue_depth": 'sum(vllm:num_requests_waiting{model_name="llama"})',
        "in_flight": 'sum(vllm:num_requests_running{model_name="llama"})',
        "tokens_per_second": 'sum(rate(vllm:generation_tokens_total{model_name="llama"}[1m]))',
        "prompt_tokens_per_second":
            'sum(rate(vllm:prompt_tokens_total{model_name="llama"}[1m]))',
        "kv_cache_usage": 'avg(vllm:kv_cache_usage_perc{model_name="llama"})',
        "completion_rate": 'sum(rate(vllm:request_success_total{model_name="llama"}[1m]))',
        "p95_latency": "histogram_quantile(0.95, sum by (le) "
        '(rate(vllm:time_to_first_token_seconds_bucket{model_name="llama"}[1m])))',
    }


@pytest.mark.parametrize(
    ("preset", "metric", "signals"),
    [
        ("vllm", "e2e", {"queue_depth", "in_flight", "tokens_per_second",
                         "prompt_tokens_per_second", "kv_cache_usage", "p95_latency",
                         "completion_rate"}),
        ("vllm", "itl", {"queue_depth", "in_flight", "tokens_per_second",
                         "prompt_tokens_per_second", "kv_cache_usage", "completion_rate"}),
        ("sglang", "ttft", {"queue_depth", "in_flight", "tokens_per_second",
                            "prompt_tokens_per_second", "kv_cache_usage", "p95_latency",
                            "completion_rate"}),
        ("tgi", "e2e", {"queue_depth", "in_flight", "p95_latency", "completion_rate"}),
        ("tgi", "ttft", {"queue_depth", "in_flight", "completion_rate"}),
    ],
)
def test_preset_signals(preset: str, metric: str, signals: set[str]) -> None:
    queries = prometheus.preset_queries(preset, sel="{}",
                                        latency_metric=vocabulary.LatencyMetric(metric))
    assert set(queries) == signals


def test_custom_queries_override_and_selector_escapes() -> None:
    target = prometheus.target_from_policy(
        policy("custom", queries={"queue_depth": "sum(my_queue)", "p95_latency": "my_p95"},
               metric="e2e")
    )
    assert target is not None
    assert dict(target.queries) == {"queue_depth": "sum(my_queue)", "p95_latency": "my_p95"}
    assert prometheus.selector({"model": 'a"b\\c'}) == '{model="a\\"b\\\\c"}'


@pytest.mark.parametrize(
    ("signal", "result", "expected"),
    [
        ("queue_depth", [], None),
        ("queue_depth", [{"metric": {}, "value": [1.0, "NaN"]}], None),
        ("queue_depth", [{"metric": {}, "value": [1.0, "+Inf"]}], None),
        ("queue_depth", [{"metric": {}, "value": [1.0, "-Inf"]}], None),
        ("queue_depth", [{"metric": {}, "value": [1.0, "0"]}], 0.0),
        ("queue_depth", [{"value": [1.0, "2"]}, {"value": [1.0, "3"]}], 5.0),
        ("queue_depth", [{"value": [1.0, "2"]}, {"value": [1.0, "NaN"]}], 2.0),
        ("p95_latency", [{"value": [1.0, "2"]}, {"value": [1.0, "3"]}], 3.0),
        ("kv_cache_usage", [{"value": [1.0, "0.2"]}, {"value": [1.0, "0.4"]}], 0.3),
        ("queue_depth", [1.0, "4"], 4.0),  # a scalar result
        ("queue_depth", {"unexpected": True}, None),
        ("queue_depth", [{"value": "garbage"}], None),
    ],
)
def test_value_of_results(signal: str, result: object, expected: float | None) -> None:
    value = prometheus.value_of(vocabulary.Signal(signal), result)
    assert value == (pytest.approx(expected) if expected is not None else None)


# --- against a real Prometheus ------------------------------------------------------------


async def test_vllm_preset_against_prometheus(
    prom: prometheus_server.PrometheusServer, sink: ListSink
) -> None:
    source = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=prom.url), prometheus.PrometheusConfig()
    )
    try:
        target = prometheus.target_from_policy(policy("vllm"), rate_window=WINDOW)
        signals = await poll(source, target, sink)
    finally:
        await source.close()
    assert signals["queue_depth"] == 8.0  # 5 + 3 over two pods
    assert signals["in_flight"] == 16.0
    assert signals["kv_cache_usage"] == pytest.approx(0.6)
    tokens = signals["tokens_per_second"]
    assert tokens is not None and tokens == pytest.approx(150.0, rel=0.05)  # 100 + 50 tok/s
    prompt = signals["prompt_tokens_per_second"]
    assert prompt is not None and prompt == pytest.approx(3000.0, rel=0.05)  # 2,000 + 1,000
    finished = signals["completion_rate"]   # 8 + 2 (two finish reasons) + 5 requests/s
    assert finished is not None and finished == pytest.approx(15.0, rel=0.05)
    # Prometheus merges the two pods' buckets and interpolates as the store does.
    merged = histogram.Histogram(
        le=TTFT_LE, counts=tuple(a + b for a, b in zip(TTFT_A[:-1], TTFT_B[:-1], strict=True))
    )
    expected = merged.quantile(0.95)
    assert expected == pytest.approx(1 + 1.5 * 9.5 / 11)
    assert signals["p95_latency"] == pytest.approx(expected, rel=1e-6)
    assert source.stats.accepted == 1 and not source.stats.errors


async def test_e2e_latency_and_other_presets(
    prom: prometheus_server.PrometheusServer, sink: ListSink
) -> None:
    source = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=prom.url), prometheus.PrometheusConfig()
    )
    try:
        vllm = await poll(source, prometheus.target_from_policy(
            policy("vllm", metric="e2e"), rate_window=WINDOW), ListSink())
        sglang = await poll(source, prometheus.target_from_policy(
            policy("sglang"), rate_window=WINDOW), ListSink())
        tgi = await poll(source, prometheus.target_from_policy(
            policy("tgi", metric="e2e"), rate_window=WINDOW), ListSink())
        dcgm = await poll(source, prometheus.target_from_policy(
            policy("custom", queries={"queue_depth": "vector(0)"}),
            dcgm_selector='{namespace="inference",pod=~"llama-.*"}'), sink)
    finally:
        await source.close()
    e2e = 5 + 5 * 1.5 / 2  # rank 9.5 of 10 in (5, 10] holding 2, 1.5 below the rank
    assert vllm["p95_latency"] == pytest.approx(e2e, rel=1e-6)
    assert sglang["queue_depth"] == 7.0 and sglang["in_flight"] == 9.0
    assert sglang["tokens_per_second"] == 321.5
    assert sglang["kv_cache_usage"] == pytest.approx(0.28)
    assert sglang["completion_rate"] == pytest.approx(3.0, rel=0.05)
    # One pod: rank 19 of 20 in (1, 2.5] holding 6, 5 of them below the rank.
    assert sglang["p95_latency"] == pytest.approx(1 + 1.5 * 5 / 6, rel=1e-6)
    assert tgi == {"queue_depth": 2.0, "in_flight": 4.0, "p95_latency": pytest.approx(e2e),
                   "completion_rate": pytest.approx(2.0, rel=0.05)}
    assert dcgm["gpu_engine_active"] == pytest.approx(0.6)
    assert dcgm["gpu_sm_active"] == pytest.approx(0.4)
    assert dcgm["gpu_fb_used_mib"] == 4000.0
    assert dcgm["queue_depth"] == 0.0  # a real zero stays zero


async def test_empty_and_nan_results_are_missing_not_zero(
    prom: prometheus_server.PrometheusServer, sink: ListSink
) -> None:
    source = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=prom.url), prometheus.PrometheusConfig()
    )
    try:
        idle = await poll(source, prometheus.target_from_policy(
            policy("vllm", name="idle"), rate_window=WINDOW), sink)
        absent = await poll(source, prometheus.target_from_policy(
            policy("vllm", name="absent"), rate_window=WINDOW), ListSink())
    finally:
        await source.close()
    # idle: NaN gauge, histogram with zero rate (histogram_quantile gives NaN).
    assert idle["queue_depth"] is None
    assert idle["p95_latency"] is None
    # absent: every query returns an empty vector.
    assert set(absent.values()) == {None}
    assert not source.stats.errors
    # In the store a missing sample erases the source's earlier value.
    assert all(s.missing for s in sink.samples if s.signal in ("queue_depth", "p95_latency"))


async def test_errors_and_timeouts_emit_nothing_and_never_raise(
    prom: prometheus_server.PrometheusServer, exporter_port: int, sink: ListSink
) -> None:
    bad_query = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=prom.url), prometheus.PrometheusConfig()
    )
    refused = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=f"http://127.0.0.1:{free_port()}"),
        prometheus.PrometheusConfig(),
    )
    slow = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=f"http://127.0.0.1:{exporter_port}/slow",
                                      timeout_s=0.2),
        prometheus.PrometheusConfig(),
    )
    target = prometheus.PromTarget(model=KEY, queries=((vocabulary.Signal.QUEUE_DEPTH, "sum(("),))
    try:
        await poll(bad_query, target, sink)
        await poll(refused, target, sink)
        await poll(slow, target, sink)
    finally:
        for source in (bad_query, refused, slow):
            await source.close()
    assert sink.samples == []
    assert bad_query.stats.errors == {"PrometheusApiClientException": 1}
    assert sum(refused.stats.errors.values()) == 1
    assert sum(slow.stats.errors.values()) == 1


async def test_run_polls_targets_at_their_interval(
    prom: prometheus_server.PrometheusServer, sink: ListSink, start: Start
) -> None:
    target = prometheus.target_from_policy(policy("vllm"), rate_window=WINDOW)
    assert target is not None
    fast = prometheus.PromTarget(model=target.model, queries=target.queries[:1], interval_s=0.05)
    source = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=prom.url), prometheus.PrometheusConfig(targets=(fast,))
    )
    start(source.run(sink))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while source.stats.accepted < 3 and loop.time() < deadline:
        await asyncio.sleep(0.02)
    assert source.stats.accepted >= 3
    assert {s.signal for s in sink.samples} == {target.queries[0][0]}


async def test_a_closed_source_polls_again(
    prom: prometheus_server.PrometheusServer, sink: ListSink
) -> None:
    # A supervisor that restarts the task after `run` closed the client gets a new one.
    source = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=prom.url), prometheus.PrometheusConfig()
    )
    target = prometheus.PromTarget(
        model=KEY,
        queries=((vocabulary.Signal.QUEUE_DEPTH, 'sum(vllm:num_requests_waiting{pod="a"})'),),
    )
    try:
        await poll(source, target, sink)
        await source.close()
        await poll(source, target, sink)
    finally:
        await source.close()
    assert [s.value for s in sink.samples] == [5.0, 5.0]


async def test_an_implausible_result_is_dropped_and_counted(
    prom: prometheus_server.PrometheusServer, sink: ListSink
) -> None:
    # One pod "running" 10^12 requests is a broken exporter, never a reason to scale.
    source = prometheus.PrometheusSource(prometheus.PrometheusSettings(url=prom.url))
    target = prometheus.PromTarget(model=KEY, queries=(
        (vocabulary.Signal.IN_FLIGHT, "vector(1e12)"),
        (vocabulary.Signal.QUEUE_DEPTH, "vector(3)")))
    try:
        await poll(source, target, sink)
    finally:
        await source.close()
    assert [(s.signal, s.value) for s in sink.samples] == [(vocabulary.Signal.QUEUE_DEPTH, 3.0)]
    assert source.stats.dropped == {"implausible": 1}
