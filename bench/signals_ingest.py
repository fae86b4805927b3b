"""Signal ingestion benchmark: NATS publish -> parse -> signal store, against a real nats-server.

Usage: .venv/bin/python bench/signals_ingest.py [--models 1000] [--messages 200000]
                                                 [--rate 20000] [--seconds 5]

Phase 1 (throughput): a publisher process sends --messages as fast as it can, spread
over --models models; the subscriber (this process, one event loop, one core) parses and
stores them and the rate is counted from the first to the last message stored.
Phase 2 (latency): the publisher paces --rate messages/s for --seconds; each message
carries its publish time, and the time from publish to "stored" is recorded
(p50/p99). Both processes share the machine with nats-server.
Also: parse-only and store-only costs per message, in-process. By default the subscriber
calls gc.freeze() after start-up (see --no-gc-freeze).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaler.signals import connection, messages, nats_core, samples, store  # noqa: E402
from scaler.testing import nats_server  # noqa: E402

PREFIX = "scaler.signals"
NAMESPACE = "bench"


def subject(model: int) -> str:
    return f"{PREFIX}.{NAMESPACE}.model-{model}"


def body(model: int, ts: float) -> bytes:
    return json.dumps(
        {"v": 1, "model": f"model-{model}", "namespace": NAMESPACE, "source": f"pod-{model}-0",
         "ts": ts, "queue_depth": model % 17, "in_flight": model % 31,
         "tokens_per_second": 1234.5}, separators=(",", ":"),
    ).encode()


# -- publisher process ----------------------------------------------------------------------


async def publish(url: str, *, count: int, models: int, rate: float) -> None:
    import nats

    client = await nats.connect(url, pending_size=64 * 1024 * 1024)
    try:
        if rate <= 0:
            for i in range(count):
                await client.publish(subject(i % models), body(i % models, time.time()))
                if i % 2000 == 0:
                    await asyncio.sleep(0)  # let the flusher run
        else:
            # Paced: a batch every 1 ms, so 20,000 msg/s is 20 per batch.
            batch = max(1, round(rate / 1000))
            start = time.perf_counter()
            sent = 0
            while sent < count:
                for _ in range(min(batch, count - sent)):
                    model = sent % models
                    await client.publish(subject(model), body(model, time.time()))
                    sent += 1
                ahead = sent / rate - (time.perf_counter() - start)
                # Sleeping also lets nats-py's flusher write the batch to the socket.
                await asyncio.sleep(max(0.0, ahead))
        await client.flush(timeout=30)
    finally:
        await client.close()


# -- subscriber (this process) ------------------------------------------------------------


class TimingSink:
    """Stores samples, then records the publish-to-stored latency and the stored time."""

    def __init__(self, signal_store: store.SignalStore) -> None:
        self.store = signal_store
        self.latencies: list[float] = []
        self.first: float | None = None
        self.last = 0.0
        self.messages = 0
        self.cpu_s = 0.0

    def put(self, batch: Sequence[samples.Sample]) -> None:
        self.store.put(batch)
        now = time.time()
        if self.first is None:
            self.first = now
        self.last = now
        self.messages += 1
        # Each message is one put; ts is its publish time (not clamped: the publisher
        # shares this machine's clock).
        self.latencies.append(now - samples[0].ts)


async def run_phase(
    server: nats_server.NatsServer, *, models: int, count: int, rate: float, freeze: bool
) -> TimingSink:
    config = nats_core.NatsCoreConfig(
        routes={subject(m): f"{NAMESPACE}/model-{m}" for m in range(models)}, wildcard=True
    )
    sink = TimingSink(store.SignalStore())
    source = nats_core.NatsCoreSource(
        connection.NatsSettings(servers=(server.url,)), config
    )
    if freeze:
        # Move everything alive after start-up out of the collector's reach: a full
        # collection then scans only new objects (measured: gen-2 pauses of 50-90 ms
        # without this, on this VM), as a long-running service should do.
        gc.collect()
        gc.freeze()
    task = asyncio.create_task(source.run(sink))
    cpu_start = time.process_time()
    try:
        await asyncio.wait_for(source.wait_ready(), 10)
        publisher = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--role", "publisher", "--url", server.url,
            "--messages", str(count), "--models", str(models), "--rate", str(rate),
        )
        try:
            loop = asyncio.get_running_loop()
            # Bounded: the expected duration plus 60 s.
            deadline = loop.time() + (count / rate if rate > 0 else 0) + 60
            while sink.messages + source.stats.dropped_total < count:
                if loop.time() > deadline:
                    print(f"timeout: stored {sink.messages} of {count}", file=sys.stderr)
                    break
                await asyncio.sleep(0.05)
            await asyncio.wait_for(publisher.wait(), 30)
        finally:
            if publisher.returncode is None:
                publisher.kill()
                await publisher.wait()
        sink.cpu_s = time.process_time() - cpu_start
        if source.stats.dropped_total or source.stats.errors:
            print(f"dropped {source.stats.dropped} errors {source.stats.errors}",
                  file=sys.stderr)
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    return sink


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def micro(models: int) -> tuple[float, float]:
    """Parse-only and store-only cost, microseconds per message."""
    n = 50_000
    now = time.time()
    bodies = [body(i % models, now) for i in range(n)]
    route = messages.Route(models={f"{NAMESPACE}/model-{m}": 30.0 for m in range(models)})
    start = time.perf_counter()
    parsed = [messages.parse(b, now=now, route=route) for b in bodies]
    parse_us = (time.perf_counter() - start) / n * 1e6
    signal_store = store.SignalStore()
    start = time.perf_counter()
    for result in parsed:
        assert isinstance(result, tuple)
        signal_store.put(result)
    store_us = (time.perf_counter() - start) / n * 1e6
    return parse_us, store_us


async def main_async(args: argparse.Namespace) -> None:
    parse_us, store_us = micro(args.models)
    print(f"in-process: parse {parse_us:.1f} us/msg, store {store_us:.1f} us/msg "
          f"({args.models} models)")
    with nats_server.NatsServer(jetstream=False) as server:
        freeze = not args.no_gc_freeze
        sink = await run_phase(
            server, models=args.models, count=args.messages, rate=0, freeze=freeze
        )
        elapsed = sink.last - (sink.first or sink.last)
        rate = (sink.messages - 1) / elapsed if elapsed > 0 else float("nan")
        print(f"throughput: {sink.messages} msgs for {args.models} models stored in "
              f"{elapsed:.2f} s = {rate:,.0f} msgs/s; subscriber CPU {sink.cpu_s:.2f} s = "
              f"{sink.messages / sink.cpu_s:,.0f} msgs per CPU-second (publisher unpaced; "
              f"latency under backlog p50 {percentile(sink.latencies, 0.5) * 1e3:.1f} ms)")
        count = int(args.rate * args.seconds)
        sink = await run_phase(
            server, models=args.models, count=count, rate=args.rate, freeze=freeze
        )
        lat = sink.latencies
        print(f"latency at {args.rate:,.0f} msgs/s for {args.seconds:.0f} s, {args.models} "
              f"models ({len(lat)} msgs): p50 {percentile(lat, 0.5) * 1e3:.2f} ms, "
              f"p99 {percentile(lat, 0.99) * 1e3:.2f} ms, max {max(lat) * 1e3:.2f} ms, "
              f"mean {statistics.fmean(lat) * 1e3:.2f} ms; gc.freeze {freeze}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["bench", "publisher"], default="bench")
    parser.add_argument("--url", default="")
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=20_000)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="leave the start-up heap to the garbage collector")
    args = parser.parse_args()
    if args.role == "publisher":
        asyncio.run(publish(args.url, count=args.messages, models=args.models, rate=args.rate))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
