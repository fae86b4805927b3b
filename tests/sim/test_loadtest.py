"""`scaler loadtest` against a small streaming server of known delays, on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import prometheus_client
import pytest
from aiohttp import web

from scaler import cli
from scaler.emulator import env as kube_env
from scaler.service import http_api
from scaler.service import web as service_web
from scaler.sim import loadtest, report, traces
from tests.service import factories as service_factories

TTFT_S = 0.05
PER_TOKEN_S = 0.01
SLOW_TTFT_S = 1.5
STALL_S = 3.0


@dataclass
class Server:
    """A streaming OpenAI-style server whose behaviour is the request's model name:
    `ok` (TTFT 50 ms, 10 ms a token), `slow` (TTFT 1.5 s), `error500`, `bad400`, `drop`
    (closes the connection after 3 tokens), `stall` (stops for 3 s after one token),
    `garbage` (a data line that is not JSON)."""

    url: str
    # (model, monotonic receive time): the server's view of when requests arrived.
    received: list[tuple[str, float]] = field(default_factory=list)


async def _completions(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    body = await request.json()
    model = body["model"]
    server.received.append((model, time.monotonic()))
    if model == "error500":
        return web.Response(status=500, text="boom")
    if model == "bad400":
        return web.json_response({"error": "prompt too long"}, status=400)
    chat = request.path.endswith("chat/completions")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await asyncio.sleep(SLOW_TTFT_S if model == "slow" else TTFT_S)
    tokens = int(body["max_tokens"])
    for i in range(tokens):
        if i:
            await asyncio.sleep(PER_TOKEN_S)
        if model == "drop" and i == 3:
            assert request.transport is not None
            request.transport.close()
            return response
        if model == "stall" and i == 1:
            await asyncio.sleep(STALL_S)
        if model == "garbage":
            await response.write(b"data: not json\n\n")
        choice = {"index": 0, "delta": {"content": "x"}} if chat else {"index": 0, "text": "x"}
        await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
    usage = {"choices": [], "usage": {"completion_tokens": tokens}}
    await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return response


SERVER = web.AppKey("server", Server)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """The server on its own thread and event loop, so the client's loop is alone."""
    loop = asyncio.new_event_loop()
    state = Server(url="")
    app = web.Application()
    app[SERVER] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _completions)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    try:
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        thread.start()
        yield state
    finally:
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
        else:
            loop.run_until_complete(runner.cleanup())
        loop.close()


def _requests(times: list[float], *, output: int = 20) -> list[loadtest.Request]:
    return [loadtest.Request(t, 100, output) for t in times]


def _run(requests: object, server: Server, model: str, **target: object) -> loadtest.LiveRun:
    return asyncio.run(loadtest.run(requests,  # type: ignore[arg-type]
                                    loadtest.Target(url=server.url, model=model,
                                                    **target)))  # type: ignore[arg-type]


def test_a_slow_server_does_not_slow_the_schedule(server: Server) -> None:
    # 20 requests 50 ms apart (0.95 s) while each answer takes over 1.5 s: a closed-loop
    # client would send them 1.5 s apart (28.5 s in all); the open-loop one keeps the
    # trace's times. How closely it keeps them is a measurement of the machine
    # (bench/loadtest_client.py, p99 schedule lag); here the bounds are the behaviour's.
    times = [i * 0.05 for i in range(20)]
    before = len(server.received)
    live = _run(_requests(times, output=2), server, "slow")
    sent = [t for model, t in server.received[before:] if model == "slow"]
    assert len(sent) == 20
    assert live.records.outcome.count(0) == 20
    # Every request reached the server before the first answer could have come back...
    assert sent[-1] - sent[0] < SLOW_TTFT_S
    # ...at the trace's spacing, not all at once: a stalled loop catching up sends a few
    # together, which moves no median.
    assert 0.025 < float(np.median(np.diff(sent))) < 0.1
    assert live.wall_s > SLOW_TTFT_S + times[-1]


def test_ttft_itl_and_e2e_are_measured_against_known_delays(server: Server) -> None:
    live = _run(_requests([0.0, 0.1, 0.2], output=20), server, "ok")
    ttft = np.asarray(live.records.ttft_s)
    itl = np.asarray(live.records.itl_s)
    e2e = np.asarray(live.records.e2e_s)
    # TTFT 50 ms and 10 ms a token on the server: never less, and not far more.
    assert np.all(ttft >= TTFT_S * 0.95) and np.all(ttft < TTFT_S + 0.25)
    assert np.all(itl >= PER_TOKEN_S * 0.9) and np.all(itl < PER_TOKEN_S * 5)
    assert np.all(e2e >= ttft + 19 * PER_TOKEN_S * 0.9)
    assert live.records.tokens_received == 60
    gaps = live.records.gaps
    assert gaps.total == 57  # 19 gaps in each of 3 streams
    assert PER_TOKEN_S * 0.9 <= gaps.quantile(0.5) < PER_TOKEN_S * 5


def test_the_chat_api_streams_deltas(server: Server) -> None:
    live = _run(_requests([0.0], output=5), server, "ok", api="chat")
    assert list(live.records.outcome) == [0]
    assert live.records.tokens_received == 5


@pytest.mark.parametrize(("model", "kind"), [
    ("error500", "http_5xx"), ("bad400", "http_4xx"), ("drop", "disconnect"),
    ("stall", "timeout"), ("garbage", "protocol")])
def test_errors_are_counted_by_kind(server: Server, model: str, kind: str) -> None:
    live = _run(_requests([0.0, 0.01], output=10), server, model, timeout_s=1.0)
    assert live.errors[kind] == 2
    assert sum(live.errors.values()) == 2
    summary = loadtest.summary(live, metric="ttft", threshold_s=2.0)
    assert summary["completed"] == 0
    assert summary["rejected"] == (2 if kind == "http_4xx" else 0)
    # A failed request misses the SLO even when its first token came (drop, stall):
    # rejected ones are judged by no SLO figure, as in the simulator.
    assert summary["slo_attainment"] == (1.0 if kind == "http_4xx" else 0.0)
    if kind in ("disconnect", "timeout"):
        assert np.all(np.isfinite(np.asarray(live.records.ttft_s)))


def test_an_unreachable_server_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    live = asyncio.run(loadtest.run(_requests([0.0]), loadtest.Target(
        url=f"http://127.0.0.1:{port}", model="ok")))
    assert live.errors["connect"] == 1


def test_max_concurrency_drops_rather_than_delays(server: Server) -> None:
    live = _run(_requests([0.0, 0.01, 0.02, 0.03, 0.04], output=2), server, "slow",
                max_concurrency=2)
    assert live.errors["concurrency_limit"] == 3
    assert live.records.outcome.count(0) == 2


def test_a_lagging_client_is_not_a_valid_measurement(server: Server) -> None:
    # A trace source that blocks the loop for 200 ms before the 5th request: it and
    # the ones after it leave late, which the client measures and reports.
    def slow_source() -> Iterator[loadtest.Request]:
        for index, request in enumerate(_requests([i * 0.01 for i in range(10)], output=2)):
            if index == 4:
                time.sleep(0.2)
            yield request

    lagged = _run(slow_source(), server, "ok")
    assert loadtest.lag_p99_ms(lagged.records) > 100
    assert loadtest.client_health(lagged, max_lag_ms=50)["valid"] is False
    fine = _run(_requests([i * 0.01 for i in range(10)], output=2), server, "ok")
    assert loadtest.client_health(fine, max_lag_ms=50)["valid"] is True


def test_a_stop_ends_the_run_with_a_partial_record(server: Server) -> None:
    async def stopped_early() -> loadtest.LiveRun:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        return await loadtest.run(_requests([i * 0.1 for i in range(20)], output=2),
                                  loadtest.Target(url=server.url, model="slow"), stop=stop)

    live = asyncio.run(stopped_early())
    assert live.interrupted
    # About 3 requests were sent (at 0, 0.1, 0.2 s), none answered within 0.3 s.
    assert 1 <= len(live.records) < 20
    assert loadtest.summary(live, metric="ttft", threshold_s=2.0)["unfinished"] == len(
        live.records)


def _csv_trace(path: Path, *, rows: int, gap_s: float) -> Path:
    with path.open("w") as handle:
        handle.write("timestamp_s,input_tokens,output_tokens\n")
        for i in range(rows):
            handle.write(f"{100 + i * gap_s:.4f},{50 + i % 7},{3}\n")
    return path


def test_the_cli_writes_the_simulators_keys_and_gates_on_lag(server: Server,
                                                            tmp_path: Path) -> None:
    trace = _csv_trace(tmp_path / "t.csv", rows=10, gap_s=0.02)
    out = tmp_path / "live.json"
    page = tmp_path / "live.html"
    argv = ["loadtest", "--url", server.url, "--model", "ok", "--trace", str(trace),
            "--json", str(out), "--report", str(page)]
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, report.SCHEMA)
    assert doc["policy"] is None and doc["slo"] == {"metric": "ttft", "threshold_s": 2.0}
    live = doc["strategies"]["live"]
    assert live["requests"] == live["completed"] == 10
    assert live["valid"] is True and sum(live["errors"].values()) == 0
    assert set(live["errors"]) == set(loadtest.ERROR_KINDS)
    # No replica timeline read: no cost keys, rather than made-up ones.
    assert "gpu_hours" not in live and doc["loadtest"]["replicas"] is None
    series = doc["loadtest"]["series"]
    assert series["p95_window_t"] == [0.0] and len(series["p95"]) == 1
    assert "Load test of" in page.read_text()
    # The same run judged against an impossible lag bound: reported, and exit code 3.
    assert cli.main([*argv, "--max-lag-ms", "0.000001"]) == 3
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, report.SCHEMA)
    assert doc["strategies"]["live"]["valid"] is False


def test_the_schema_refuses_a_live_result_without_its_own_keys() -> None:
    live = {"requests": 1, "completed": 1, "rejected": 0, "unfinished": 0,
            "slo_attainment": 1.0, "p95_windows_met": 1.0, "p50_latency_s": 0.1,
            "p95_latency_s": 0.1, "p99_latency_s": 0.1,
            "schedule_lag_ms": {"p50": 0.1, "p99": 0.2, "max": 0.3, "threshold_p99": 50.0},
            "valid": True, "errors": {"http_5xx": 0}}
    doc = {"trace": {"path": "t", "requests": 1, "duration_s": 0.0, "rate_scale": 1.0},
           "policy": None, "slo": {"metric": "ttft", "threshold_s": 2.0},
           "strategies": {"live": live}}
    jsonschema.validate(doc, report.SCHEMA)
    for key in ("schedule_lag_ms", "errors", "valid"):
        broken = {**doc, "strategies": {"live": {k: v for k, v in live.items() if k != key}}}
        with pytest.raises(jsonschema.ValidationError, match=key):
            jsonschema.validate(broken, report.SCHEMA)
    # A simulated strategy still needs its cost keys.
    with pytest.raises(jsonschema.ValidationError, match="gpu_hours"):
        jsonschema.validate({**doc, "strategies": {"scaler": live}}, report.SCHEMA)


def test_the_policy_states_the_slo_and_the_prices(server: Server, tmp_path: Path) -> None:
    # The policy's p95Latency (e2e within 0.1 s) judges the run, not the flags' default
    # (TTFT 2 s): each request takes about 50 ms + 2 x 10 ms, so all are within 0.1 s;
    # a 0.06 s bound fails them all.
    trace = _csv_trace(tmp_path / "t.csv", rows=5, gap_s=0.05)
    out = tmp_path / "live.json"
    attainment = {}
    for slo in (0.1, 0.06):
        policy = _policy(tmp_path / f"p{slo}.yaml", slo_s=slo, metric="e2e")
        assert cli.main(["loadtest", "--url", server.url, "--model", "ok", "--trace",
                         str(trace), "--policy", str(policy), "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        jsonschema.validate(doc, report.SCHEMA)
        assert doc["policy"] == "llm" and doc["slo"] == {"metric": "e2e", "threshold_s": slo}
        attainment[slo] = doc["strategies"]["live"]["slo_attainment"]
    assert attainment == {0.1: 1.0, 0.06: 0.0}
    argv = ["loadtest", "--url", server.url, "--model", "ok", "--trace", str(trace)]
    assert cli.main([*argv, "--policy", str(policy), "--slo-s", "1"]) == 2
    assert cli.main([*argv, "--policy", str(tmp_path / "none.yaml")]) == 2
    assert cli.main([*argv, "--kubeconfig", str(tmp_path / "kc")]) == 2  # no --target


def _policy(path: Path, *, slo_s: float, metric: str) -> Path:
    path.write_text(f"""apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: llm, namespace: inference}}
spec:
  target: {{name: llm}}
  replicas: {{min: 1, max: 4}}
  signals:
    concurrency: {{targetPerReplica: 8}}
    p95Latency: {{metric: {metric}, sloSeconds: {slo_s}}}
  resources: {{gpusPerReplica: 2}}
  cost: {{gpuHourly: 3.6}}
""")
    return path


def test_the_trace_is_streamed_with_the_loaders_slice_and_scale(tmp_path: Path) -> None:
    trace = _csv_trace(tmp_path / "t.csv", rows=2000, gap_s=0.5)
    loaded = traces.load_trace(trace, start_s=100.0, max_duration_s=500.0)
    streamed = list(loadtest.stream_trace(trace, start_s=100.0, duration_s=500.0))
    assert [r.at_s for r in streamed] == pytest.approx(loaded.arrival_s.tolist())
    scaled = [r.at_s for r in loadtest.stream_trace(trace, rate_scale=2.5)]
    assert scaled == sorted(scaled)
    assert 2.5 * 2000 * 0.9 < len(scaled) < 2.5 * 2000 * 1.1
    assert max(scaled) <= 2000 * 0.5


def test_memory_does_not_grow_with_the_trace(tmp_path: Path) -> None:
    trace = _csv_trace(tmp_path / "big.csv", rows=50_000, gap_s=0.01)
    tracemalloc.start()
    try:
        count = sum(1 for _ in loadtest.stream_trace(trace))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000
    # Loading the same rows into lists holds about 100 bytes a row (5 MB); streaming
    # holds one row and the reader's buffer.
    assert peak < 1_000_000


def test_an_unsorted_trace_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("timestamp_s,input_tokens,output_tokens\n5,1,1\n3,1,1\n")
    with pytest.raises(traces.TraceError, match=r"bad.csv:3.*sorted"):
        list(loadtest.stream_trace(trace))


def test_prompts_have_the_length_and_no_shared_prefix() -> None:
    first = loadtest.prompt_text(tokens=1000, index=1)
    second = loadtest.prompt_text(tokens=1000, index=2)
    assert len(first) == 1000 * loadtest.CHARS_PER_TOKEN
    assert first[:2] != second[:2]
    assert loadtest.endpoint("http://h:8000", "chat") == "http://h:8000/v1/chat/completions"
    assert loadtest.endpoint("http://h:8000/v1/", "completions") == "http://h:8000/v1/completions"


@dataclass
class Cluster:
    """The Kubernetes API emulator (or the SCALER_TEST_KUBECONFIG cluster) on its own
    thread and loop, with a kubeconfig file that points at it."""

    env: kube_env.KubeTestEnv
    loop: asyncio.AbstractEventLoop
    kubeconfig: Path

    def do(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    real = os.environ.get("SCALER_TEST_KUBECONFIG")
    manager = kube_env.kube_test_env(kubeconfig=real, wall_clock=kube_env.ManualClock())
    env = asyncio.run_coroutine_threadsafe(manager.__aenter__(), loop).result(timeout=30)
    try:
        kubeconfig = Path(real) if real else tmp_path / "kubeconfig"
        if not real:
            kubeconfig.write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
                "clusters": [{"name": "emulator", "cluster": {"server": env.settings.host}}],
                "users": [{"name": "tester", "user": {}}],
                "contexts": [{"name": "emulator",
                              "context": {"cluster": "emulator", "user": "tester"}}]}))
        yield Cluster(env=env, loop=loop, kubeconfig=kubeconfig)
    finally:
        asyncio.run_coroutine_threadsafe(manager.__aexit__(None, None, None),
                                         loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_the_replica_timeline_of_a_deployment_prices_the_run(
        server: Server, cluster: Cluster, tmp_path: Path) -> None:
    # 1 replica at the start, 3 asked for 0.5 s into a 1.5 s trace (the deployment
    # controller's status write follows), while the load test runs.
    env = cluster.env
    before = len(server.received)
    cluster.do(env.create_deployment("llm", replicas=1))
    path = f"{env.collection('apps/v1', 'deployments')}/llm"

    async def scale_later() -> None:
        # Once the 6th request is in (the run's clock then reads about 0.5 s).
        while len(server.received) < before + 6:
            await asyncio.sleep(0.01)
        await env.api.merge_patch(path, {"spec": {"replicas": 3}})

    trace = _csv_trace(tmp_path / "t.csv", rows=16, gap_s=0.1)
    policy = _policy(tmp_path / "p.yaml", slo_s=2.0, metric="ttft")
    out = tmp_path / "live.json"
    page = tmp_path / "live.html"
    scaling = asyncio.run_coroutine_threadsafe(scale_later(), cluster.loop)
    assert cli.main(["loadtest", "--url", server.url, "--model", "ok", "--trace", str(trace),
                     "--policy", str(policy), "--kubeconfig", str(cluster.kubeconfig),
                     "--target", f"{env.namespace}/llm", "--json", str(out),
                     "--report", str(page)]) == 0
    scaling.result(timeout=5)
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, report.SCHEMA)
    live = doc["strategies"]["live"]
    assert (live["max_replicas"], live["scale_events"]) == (3, 1)
    # 2 GPUs a replica (the policy's) at 3.6 an hour, over the 1.5 s of the trace:
    # 1 replica for about 0.5 s, then 3 (once the status says so).
    duration = doc["trace"]["duration_s"]
    assert 2 * duration / 3600 < live["gpu_hours"] < 6 * duration / 3600
    assert live["cost"] == pytest.approx(live["gpu_hours"] * 3.6, abs=2e-4)
    assert 0 <= live["idle_cost"] <= live["cost"]
    assert live["cost_per_1k_requests"] == pytest.approx(live["cost"] / 16 * 1000, abs=0.01)
    series = doc["loadtest"]["series"]
    assert series["desired"][0] == 1.0 and 3.0 in series["desired"]
    assert doc["loadtest"]["replicas"]["source"] == f"deployment {env.namespace}/llm"
    assert "<th>GPU-h</th>" in page.read_text()
    # A Deployment that is not there: refused before a request is sent.
    before = len(server.received)
    assert cli.main(["loadtest", "--url", server.url, "--model", "ok", "--trace", str(trace),
                     "--kubeconfig", str(cluster.kubeconfig), "--target",
                     f"{env.namespace}/missing"]) == 2
    assert len(server.received) == before


def test_the_replica_timeline_from_scalers_decision_api(server: Server, tmp_path: Path
                                                        ) -> None:
    # The service's real HTTP API on its own thread, holding a decision for the policy's
    # model (inference/llm): 3 desired, 2 ready and 1 starting.
    state = service_factories.loaded_state(service_factories.policy("llm"))
    state.record("inference/llm", service_factories.observation(
        current=2, desired=3, ready=2, starting=(1.0,), model_name="inference/llm"))
    api = http_api.HttpApi(state, registry=prometheus_client.CollectorRegistry())
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    running = asyncio.run_coroutine_threadsafe(
        service_web.serve(api.app(), host="127.0.0.1", port=0), loop).result(timeout=10)
    try:
        trace = _csv_trace(tmp_path / "t.csv", rows=5, gap_s=0.05)
        policy = _policy(tmp_path / "p.yaml", slo_s=2.0, metric="ttft")
        out = tmp_path / "live.json"
        assert cli.main(["loadtest", "--url", server.url, "--model", "ok", "--trace",
                         str(trace), "--policy", str(policy), "--scaler-url", running.url,
                         "--poll", "0.05", "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        jsonschema.validate(doc, report.SCHEMA)
        live = doc["strategies"]["live"]
        assert (live["max_replicas"], live["scale_events"]) == (3, 0)
        # 3 allocated (2 ready + 1 starting) x 2 GPUs over the trace's 0.2 s.
        assert live["gpu_hours"] == pytest.approx(3 * 2 * doc["trace"]["duration_s"] / 3600,
                                                  abs=2e-4)
        assert doc["loadtest"]["replicas"]["source"].endswith("model inference/llm")
        assert cli.main(["loadtest", "--url", server.url, "--model", "ok", "--trace",
                         str(trace), "--scaler-url", running.url]) == 2  # no model key
    finally:
        asyncio.run_coroutine_threadsafe(running.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
