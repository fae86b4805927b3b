"""The registry of signal sources: the one place that knows which sources exist.

The service builds them here and then only loops: `run` each under supervision,
`update` each on a policy reload, `close` each at shutdown, export each one's `stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaler.signals import connection, http_push, jetstream, nats_core, prometheus, samples, source


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """What building the sources needs.

    nats: the connection (NATS core and JetStream share it). subscribe: how NATS core
    subscribes (prefix, wildcard, queue group, message limits). prometheus: the server
    and its client settings. push: the HTTP push endpoint's rules, None when disabled.
    """

    nats: connection.NatsSettings
    subscribe: nats_core.NatsCoreConfig
    prometheus: prometheus.PrometheusSettings
    push: http_push.HttpPushConfig | None = None


def build(
    settings: SourceSettings, *, clock: samples.Clock = samples.wall_clock
) -> tuple[source.SignalSource, ...]:
    """Every source the settings enable, in start order."""
    link = connection.LinkLog()  # one log line per NATS outage, not one per client
    built: list[source.SignalSource] = [
        nats_core.NatsCoreSource(settings.nats, clock=clock, subscribe=settings.subscribe,
                                 link=link),
        jetstream.JetStreamLagSource(settings.nats, clock=clock, link=link),
        prometheus.PrometheusSource(settings.prometheus, clock=clock),
    ]
    if settings.push is not None:
        built.append(http_push.HttpPushSource(settings.push, clock=clock))
    return tuple(built)
