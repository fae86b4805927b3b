"""The one backoff schedule: doubling, capped, jitter as data within its stated band."""

from __future__ import annotations

import random

import pydantic
import pytest

from scaler.actuators import settings as kube_settings
from scaler.core import backoff
from scaler.signals import connection

KUBE = backoff.Backoff(base_delay_s=0.2, max_delay_s=1.0, jitter_ratio=0.2)
EQUAL_JITTER = backoff.Backoff(base_delay_s=0.25, max_delay_s=10.0, jitter_ratio=0.5)


@pytest.mark.parametrize(
    ("policy", "retry", "jitter", "expected"),
    [
        # jitter 1 is the full step: base, doubling, then the cap.
        (KUBE, 1, 1.0, 0.2), (KUBE, 2, 1.0, 0.4), (KUBE, 3, 1.0, 0.8), (KUBE, 4, 1.0, 1.0),
        (KUBE, 5, 1.0, 1.0),
        # jitter 0 is the shortest: (1 - 0.2) of the step.
        (KUBE, 1, 0.0, 0.16), (KUBE, 4, 0.0, 0.8),
        (KUBE, 1, 0.5, 0.18),
        (EQUAL_JITTER, 1, 1.0, 0.25), (EQUAL_JITTER, 1, 0.0, 0.125), (EQUAL_JITTER, 4, 1.0, 2.0),
        (EQUAL_JITTER, 11, 0.0, 5.0), (EQUAL_JITTER, 11, 1.0, 10.0),
        # A counter that grew for days neither overflows nor passes the cap.
        (EQUAL_JITTER, 10_000, 1.0, 10.0),
        # Below 1 counts as the first retry; a draw outside [0, 1] is clamped.
        (KUBE, 0, 1.0, 0.2), (KUBE, -3, 1.0, 0.2), (KUBE, 2, 7.0, 0.4), (KUBE, 2, -1.0, 0.32),
    ],
)
def test_schedule(policy: backoff.Backoff, retry: int, jitter: float, expected: float) -> None:
    assert backoff.delay_s(policy, retry=retry, jitter=jitter) == pytest.approx(expected)


def test_no_jitter_is_the_plain_doubling() -> None:
    plain = backoff.Backoff(base_delay_s=1.0, max_delay_s=60.0, jitter_ratio=0.0)
    assert [backoff.delay_s(plain, retry=n, jitter=0.3) for n in range(1, 9)] == [
        1, 2, 4, 8, 16, 32, 60, 60]


def test_random_draws_stay_in_the_band_and_spread() -> None:
    rng = random.Random(7)
    delays = [backoff.delay_s(EQUAL_JITTER, retry=4, jitter=rng.random()) for _ in range(200)]
    assert all(1.0 <= d <= 2.0 for d in delays)
    assert len(set(delays)) > 150  # spread, not lock-step
    assert min(delays) < 1.1 and max(delays) > 1.9


@pytest.mark.parametrize(
    "fields",
    [{"base_delay_s": 0}, {"max_delay_s": -1}, {"jitter_ratio": 1.5}, {"jitter_ratio": -0.1},
     {"retries": 3}],
)
def test_invalid_backoff_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(pydantic.ValidationError):
        backoff.Backoff.model_validate(fields)


def test_both_retry_conventions_are_this_one() -> None:
    # The Kubernetes client's retries and the NATS reconnects are the same model.
    assert isinstance(kube_settings.RetrySettings(), backoff.Backoff)
    reconnect = connection.NatsSettings().reconnect
    assert isinstance(reconnect, backoff.Backoff)
    assert [backoff.delay_s(reconnect, retry=n, jitter=1.0) for n in (1, 2, 3, 7, 8)] == [
        0.25, 0.5, 1.0, 10.0, 10.0]
