"""Load-tester capacity: the highest rate one core sends with p99 schedule lag under 5 ms.

Run: .venv/bin/python bench/loadtest_client.py [--seconds 15] [--lag-ms 5]
                                               [--server sim-server|minimal]
The client (`scaler.sim.loadtest.run`) is pinned to CPU 0 and the server to CPU 1, so the
server's cost is not the client's: `scaler sim-server` (default; the 8B profile, so 200
output tokens come one decode step apart, 8 ms + 0.1 ms per stream in the batch), or
`minimal` (raw asyncio, HTTP/1.1 keep-alive, chunked SSE, 200 output tokens 20 ms apart
after a 50 ms first token: each request in flight about 4 s), a server too cheap to
limit the client. Poisson arrivals at each rate for `--seconds`; rates double from
--start-rate (10 req/s) until p99 lag passes the bound or a request fails, then two
bisection steps.
Memory per in-flight request: Python heap (tracemalloc) at the most requests in flight
over the heap before the run, divided by them, in a separate run at the highest good
rate (records of finished requests included, 33 bytes each; kernel socket buffers not).
Client CPU per token event: process CPU time over the tokens received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import tracemalloc

import numpy as np

from scaler.sim import loadtest

OUTPUT_TOKENS = 200
INPUT_TOKENS = 100
FIRST_TOKEN_S = 0.05
TOKEN_GAP_S = 0.02
TICK_S = 0.02
SIM_PROFILE = "llama-3.1-8b-h100"
MODEL = "bench"


class _Stream(asyncio.Protocol):
    """One keep-alive connection: reads a POST (headers + Content-Length body), answers
    with `max_tokens` SSE events as HTTP chunks, written by the server's shared tick."""

    def __init__(self, active: set[_Stream]) -> None:
        self.active = active
        self.buffer = b""
        self.left = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.active.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(rest) < length:
            return
        body, self.buffer = rest[:length], rest[length:]
        self.left = int(json.loads(body)["max_tokens"])
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
        asyncio.get_running_loop().call_later(FIRST_TOKEN_S, self.active.add, self)

    def tick(self) -> None:
        assert self.transport is not None
        self.left -= 1
        event = b'data: {"choices":[{"index":0,"text":"x"}]}\n\n'
        if self.left <= 0:
            event += b"data: [DONE]\n\n"
        self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        if self.left <= 0:
            self.transport.write(b"0\r\n\r\n")
            self.active.discard(self)


async def serve(port: int) -> None:
    active: set[_Stream] = set()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Stream(active), "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        while True:
            await asyncio.sleep(TICK_S)
            for stream in list(active):
                stream.tick()


def poisson(rate: float, seconds: float, seed: int) -> list[loadtest.Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2) + 10))
    return [loadtest.Request(float(t), INPUT_TOKENS, OUTPUT_TOKENS) for t in times
            if t < seconds]


def measure(url: str, rate: float, seconds: float) -> dict[str, float]:
    requests = poisson(rate, seconds, seed=int(rate))
    peak = {"in_flight": 0.0}

    def tick(progress: loadtest.Progress) -> None:
        peak["in_flight"] = max(peak["in_flight"], progress.in_flight)

    cpu = time.process_time()
    live = asyncio.run(loadtest.run(requests, loadtest.Target(url=url, model=MODEL),
                                    on_tick=tick))
    cpu = time.process_time() - cpu
    return {"rate": rate, "p99_lag_ms": loadtest.lag_p99_ms(live.records),
            "errors": sum(live.errors.values()), "in_flight": peak["in_flight"],
            "us_per_token": cpu / max(live.records.tokens_received, 1) * 1e6}


def memory_per_in_flight(url: str, rate: float, seconds: float) -> float:
    """Heap bytes per request in flight, at the most in flight during the run."""
    requests = poisson(rate, seconds, seed=1)
    peak = {"in_flight": 0, "bytes": 0}

    def tick(progress: loadtest.Progress) -> None:
        if progress.in_flight > peak["in_flight"]:
            peak["in_flight"] = progress.in_flight
            peak["bytes"] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    asyncio.run(loadtest.run(requests, loadtest.Target(url=url, model=MODEL), on_tick=tick))
    tracemalloc.stop()
    return (peak["bytes"] - before) / max(peak["in_flight"], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--lag-ms", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--start-rate", type=float, default=10.0,
                        help="first rate tried, req/s (default 10)")
    parser.add_argument("--server", choices=("sim-server", "minimal"), default="sim-server",
                        help="what the client drives (default sim-server)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    server_cpu = {1 % (os.cpu_count() or 1)}
    if args.serve:
        os.sched_setaffinity(0, server_cpu)
        asyncio.run(serve(args.port))
        return
    os.sched_setaffinity(0, {0})
    command = ([sys.executable, "-m", "scaler", "sim-server", "--profile", SIM_PROFILE,
                "--served-model-name", MODEL, "--port", str(args.port)]
               if args.server == "sim-server" else
               [sys.executable, __file__, "--serve", "--port", str(args.port)])
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                              preexec_fn=lambda: os.sched_setaffinity(0, server_cpu))
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not (line.strip() == "ready" or line.startswith("sim-server:")):
            raise SystemExit(f"the {args.server} server did not start: {line!r}")
        url = f"http://127.0.0.1:{args.port}"
        print(f"server: {args.server}", flush=True)

        def ok(result: dict[str, float]) -> bool:
            print(f"rate {result['rate']:7.1f} req/s: p99 lag {result['p99_lag_ms']:7.2f} ms, "
                  f"errors {result['errors']:.0f}, peak in flight {result['in_flight']:.0f}, "
                  f"client CPU {result['us_per_token']:.1f} us per token event", flush=True)
            return result["p99_lag_ms"] < args.lag_ms and result["errors"] == 0

        good, bad, best = 0.0, 0.0, None
        rate = args.start_rate
        while True:
            result = measure(url, rate, args.seconds)
            if not ok(result):
                bad = rate
                break
            good, best, rate = rate, result, rate * 2
        for _ in range(2):
            middle = (good + bad) / 2
            result = measure(url, middle, args.seconds)
            if ok(result):
                good, best = middle, result
            else:
                bad = middle
        if best is None:
            print(f"not even {rate:g} req/s within {args.lag_ms:g} ms")
            return
        memory = memory_per_in_flight(url, good, args.seconds)
        print(f"highest rate with p99 lag < {args.lag_ms:g} ms on one core: {good:.0f} req/s "
              f"({OUTPUT_TOKENS}-token streams, {best['in_flight']:.0f} in flight at peak, "
              f"{best['us_per_token']:.1f} us of client CPU per token event); memory "
              f"{memory / 1024:.1f} KiB per in-flight request")
    finally:
        server.terminate()
        server.wait(timeout=10)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
