"""`scaler loadtest` against a small streaming server of known delays, on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from scaler import cli
from scaler.sim import loadtest, report, traces

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
    # 20 requests 50 ms apart (1 s) while each answer takes over 1.5 s: a closed-loop
    # client would send them 1.5 s apart; the open-loop one keeps the trace's times.
    times = [i * 0.05 for i in range(20)]
    before = len(server.received)
    live = _run(_requests(times, output=2), server, "slow")
    sent = [t for model, t in server.received[before:] if model == "slow"]
    assert len(sent) == 20
    offsets = np.asarray(sent) - sent[0]
    # Server-side receive times follow the trace within 40 ms (loopback, a loaded
    # machine, the server's thread sharing the GIL); a closed loop would be 1.5 s apart.
    assert np.max(np.abs(offsets - np.asarray(times))) < 0.04
    assert live.records.outcome.count(0) == 20
    assert loadtest.lag_p99_ms(live.records) < 40
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
    assert loadtest.details(lagged, max_lag_ms=50)["valid"] is False
    fine = _run(_requests([i * 0.01 for i in range(10)], output=2), server, "ok")
    assert loadtest.details(fine, max_lag_ms=50)["valid"] is True


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
    assert set(doc) == {"trace", "policy", "slo", "strategies", "loadtest"}
    live = doc["strategies"]["live"]
    assert set(live) <= set(report.STRATEGY_SCHEMA["properties"])
    assert {"requests", "completed", "slo_attainment", "p95_windows_met",
            "p95_latency_s"} <= set(live)
    assert live["requests"] == live["completed"] == 10
    series = doc["loadtest"]["series"]
    assert series["p95_window_t"] == [0.0] and len(series["p95"]) == 1
    assert doc["loadtest"]["valid"] is True
    assert "Load test of" in page.read_text()
    # The same run judged against an impossible lag bound: reported, and exit code 3.
    assert cli.main([*argv, "--max-lag-ms", "0.000001"]) == 3
    assert json.loads(out.read_text())["loadtest"]["valid"] is False


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
