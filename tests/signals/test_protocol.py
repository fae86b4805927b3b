"""Every polled or subscribed source satisfies the one SignalSource protocol."""

from __future__ import annotations

from scaler.signals import base, connection, jetstream, nats_core, prometheus


def test_sources_follow_the_protocol() -> None:
    settings = connection.NatsSettings()
    prom = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(), prometheus.PrometheusConfig()
    )
    sources = [
        nats_core.NatsCoreSource(settings, nats_core.NatsCoreConfig()),
        jetstream.JetStreamLagSource(settings, jetstream.JetStreamConfig()),
        prom,
    ]
    try:
        assert all(isinstance(source, base.SignalSource) for source in sources)
        assert [source.name for source in sources] == ["nats", "jetstream", "prometheus"]
        assert all(source.stats == base.SourceStats() for source in sources)
    finally:
        prom.close()


def test_poll_schedule_polls_new_targets_at_once_then_every_interval() -> None:
    schedule: base.PollSchedule[str] = base.PollSchedule()
    assert schedule.take_due([("a", 2.0)], now=10.0) == ["a"]
    assert schedule.take_due([("a", 2.0), ("b", 5.0)], now=11.0) == ["b"]
    assert schedule.wait_s(11.0) == 1.0  # a is due at 12
    assert schedule.take_due([("a", 2.0), ("b", 5.0)], now=12.0) == ["a"]
    assert schedule.take_due([("b", 5.0)], now=20.0) == ["b"]  # a removed: forgotten
    assert schedule.wait_s(20.0) == 5.0
    assert base.PollSchedule[str]().wait_s(0.0, idle_s=60.0) == 60.0
