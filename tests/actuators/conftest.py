"""Fixtures: a Kubernetes API (the emulator, or a real cluster with SCALER_TEST_KUBECONFIG)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from scaler.emulator import env as kube_env

REAL_CLUSTER = os.environ.get("SCALER_TEST_KUBECONFIG")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REAL_CLUSTER:
        return
    skip = pytest.mark.skip(reason="emulator only (SCALER_TEST_KUBECONFIG is set)")
    for item in items:
        if item.get_closest_marker("emulator_only"):
            item.add_marker(skip)


@pytest.fixture
def wall_clock() -> kube_env.ManualClock:
    return kube_env.ManualClock(1_764_400_000.0)


@pytest.fixture
def monotonic() -> kube_env.ManualClock:
    return kube_env.ManualClock(1000.0)


@pytest.fixture
async def kube(wall_clock: kube_env.ManualClock) -> AsyncIterator[kube_env.KubeTestEnv]:
    async with kube_env.kube_test_env(kubeconfig=REAL_CLUSTER, wall_clock=wall_clock) as env:
        yield env
