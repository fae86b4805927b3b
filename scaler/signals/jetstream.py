"""JetStream consumer lag (num_pending + num_ack_pending) and stream arrival rate, polled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

from scaler.core import vocabulary
from scaler.policy import model as policy_model
from scaler.signals import connection, failures, polling, samples

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LagTarget:
    """One model's durable consumer, polled every `interval_s` seconds."""

    model: str
    stream: str
    consumer: str
    interval_s: float = 2.0

    @property
    def source(self) -> str:
        return f"{vocabulary.SHARED_QUEUE_SOURCE_PREFIX}{self.stream}/{self.consumer}"


@dataclass(frozen=True, slots=True)
class JetStreamConfig:
    """The consumers to poll. timeout_s: per JetStream API request (a poll that times out
    emits nothing, so the model's values age into staleness rather than read as zero)."""

    targets: tuple[LagTarget, ...] = ()
    timeout_s: float = 2.0


def config_from_policies(
    policies: Iterable[policy_model.ScalePolicy], *, timeout_s: float = 2.0
) -> JetStreamConfig:
    """One target per policy with `spec.sources.jetstream`."""
    targets = tuple(
        LagTarget(
            model=policy.key,
            stream=source.stream,
            consumer=source.consumer,
            interval_s=source.interval_seconds,
        )
        for policy in policies
        if (source := policy.spec.sources.jetstream) is not None
    )
    return JetStreamConfig(targets=targets, timeout_s=timeout_s)


@dataclass(frozen=True, slots=True)
class SequencePoint:
    """The stream's last sequence number seen at a loop time (seconds)."""

    last_seq: int
    at: float


def arrival_rate(previous: SequencePoint | None, current: SequencePoint) -> float | None:
    """Messages per second appended to the stream between two polls (a pure function).

    Example: last_seq 1000 at t=10 s, then 1600 at t=12 s -> 300 msg/s. None for the
    first poll, a zero interval, or a sequence that went back (stream purged or
    recreated: the next poll starts over).
    """
    if previous is None or current.at <= previous.at or current.last_seq < previous.last_seq:
        return None
    return (current.last_seq - previous.last_seq) / (current.at - previous.at)


class JetStreamLagSource:
    """Polls consumer_info and stream_info through the JetStream API.

    Emits, per target: queue_depth = num_pending (published, not yet delivered: waiting),
    in_flight = num_ack_pending (delivered, not yet acknowledged: running), so the
    concurrency signal waiting + running is the consumer lag; and arrival_rate from the
    stream's last_seq deltas, a leading signal (it rises before the lag does).
    """

    def __init__(
        self,
        settings: connection.NatsSettings,
        config: JetStreamConfig | None = None,
        *,
        clock: samples.Clock = samples.wall_clock,
        link: connection.LinkLog | None = None,
    ) -> None:
        """`link` logs connection changes, shared with the service's other NATS clients."""
        self.settings = settings
        self.config = config or JetStreamConfig()
        self.stats = samples.SourceStats()
        self._link = link or connection.LinkLog()
        self._failures = failures.PollFailures(self.stats, what="jetstream poll", logger=log)
        self._clock = clock
        self._sequences: dict[LagTarget, SequencePoint] = {}
        self._poller: polling.Poller[LagTarget] = polling.Poller()

    @property
    def name(self) -> str:
        return "jetstream"

    async def update(self, policies: Sequence[policy_model.ScalePolicy]) -> None:
        """Poll the consumers the policies in force name (policy reload)."""
        self.configure(config_from_policies(policies, timeout_s=self.config.timeout_s))

    async def wait_ready(self) -> None:
        """Polled (or pushed to): nothing to wait for."""

    async def close(self) -> None:
        """Nothing beyond `run`'s own cleanup: the connection closes when it is cancelled."""

    def configure(self, config: JetStreamConfig) -> None:
        """Replace the targets; new ones are polled at once."""
        self.config = config
        kept = set(config.targets)
        self._sequences = {t: p for t, p in self._sequences.items() if t in kept}
        self._failures.keep(target.source for target in config.targets)
        self._poller.wake()

    async def run(self, sink: samples.SampleSink) -> None:
        client = Client()
        try:
            await connection.connect(client, self.settings, stats=self.stats,
                                     member=self.name, link=self._link)
            js = client.jetstream(timeout=self.config.timeout_s)

            async def poll_due(due: list[LagTarget]) -> None:
                for target in due:
                    await self.poll(js, target, sink)

            await self._poller.run(
                lambda: [(t, t.interval_s) for t in self.config.targets], poll_due
            )
        finally:
            if not client.is_closed:
                await client.close()

    async def poll(
        self, js: JetStreamContext, target: LagTarget, sink: samples.SampleSink
    ) -> None:
        """One poll of one target. Errors and timeouts are counted, never raised."""
        try:
            consumer = await js.consumer_info(
                target.stream, target.consumer, timeout=self.config.timeout_s
            )
            stream = await js.stream_info(target.stream)
        except Exception as exc:  # timeouts, missing stream/consumer, lost connection
            self.stats.error(type(exc).__name__)
            self._failures.failed(target.source, exc, now=self._clock(),
                                  detail=f"model {target.model}")
            return
        self._failures.succeeded(target.source)
        ts = self._clock()
        point = SequencePoint(last_seq=stream.state.last_seq, at=asyncio.get_running_loop().time())
        rate = arrival_rate(self._sequences.get(target), point)
        self._sequences[target] = point
        out = [
            samples.Sample(target.model, vocabulary.Signal.QUEUE_DEPTH, target.source, ts,
                        float(consumer.num_pending or 0)),
            samples.Sample(target.model, vocabulary.Signal.IN_FLIGHT, target.source, ts,
                        float(consumer.num_ack_pending or 0)),
        ]
        if rate is not None:
            out.append(samples.Sample(target.model, vocabulary.Signal.ARRIVAL_RATE,
                                      target.source, ts, rate))
        self.stats.accepted += 1
        sink.put(out)
