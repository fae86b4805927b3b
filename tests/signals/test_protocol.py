"""Every source the registry builds satisfies the one SignalSource protocol."""

from __future__ import annotations

from pathlib import Path

from scaler.policy import loader
from scaler.signals import (
    connection,
    http_push,
    nats_core,
    polling,
    prometheus,
    registry,
    samples,
    source,
)

CONFIG = Path(__file__).resolve().parents[2] / "config"


def _settings(*, push: bool) -> registry.SourceSettings:
    return registry.SourceSettings(
        nats=connection.NatsSettings(), subscribe=nats_core.NatsCoreConfig(),
        prometheus=prometheus.PrometheusSettings(),
        push=http_push.HttpPushConfig(token="t") if push else None)


async def test_registry_builds_every_source_behind_one_protocol() -> None:
    built = registry.build(_settings(push=True))
    assert [each.name for each in built] == ["nats", "jetstream", "prometheus", "http"]
    assert all(isinstance(each, source.SignalSource) for each in built)
    assert all(each.stats == samples.SourceStats() for each in built)
    # update() takes the policies in force, the same call for every source.
    policies = list(loader.load_paths([CONFIG]).policies)
    for each in built:
        await each.update(policies)
        await each.close()
    assert [each.name for each in registry.build(_settings(push=False))] == [
        "nats", "jetstream", "prometheus"]


def test_poll_schedule_polls_new_targets_at_once_then_every_interval() -> None:
    schedule: polling.PollSchedule[str] = polling.PollSchedule()
    assert schedule.take_due([("a", 2.0)], now=10.0) == ["a"]
    assert schedule.take_due([("a", 2.0), ("b", 5.0)], now=11.0) == ["b"]
    assert schedule.wait_s(11.0) == 1.0  # a is due at 12
    assert schedule.take_due([("a", 2.0), ("b", 5.0)], now=12.0) == ["a"]
    assert schedule.take_due([("b", 5.0)], now=20.0) == ["b"]  # a removed: forgotten
    assert schedule.wait_s(20.0) == 5.0
    assert polling.PollSchedule[str]().wait_s(0.0, idle_s=60.0) == 60.0
