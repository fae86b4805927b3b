"""Leadership changes are logged once each: gained at INFO, lost at WARNING, with why."""

from __future__ import annotations

import logging

import pytest

from scaler.actuators import leader
from scaler.actuators import settings as kube_settings
from scaler.emulator import Fault
from scaler.emulator.env import KubeTestEnv, ManualClock

pytestmark = [pytest.mark.kube, pytest.mark.emulator_only]


def elector(kube: KubeTestEnv, identity: str, *, wall_clock: ManualClock,
            monotonic: ManualClock) -> leader.LeaseElector:
    return leader.LeaseElector(
        kube.api, settings=kube_settings.LeaseSettings(namespace=kube.namespace, name="leader"),
        identity=identity, wall_clock=wall_clock, monotonic=monotonic)


def changes(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The leadership lines (not the per-round API failures, which are INFO details)."""
    return [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name == leader.log.name and "leader" in r.getMessage()]


async def test_each_change_of_leadership_is_one_line(
    kube: KubeTestEnv, wall_clock: ManualClock, monotonic: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert kube.emulator is not None
    caplog.set_level(logging.INFO, logger=leader.log.name)
    a = elector(kube, "a", wall_clock=wall_clock, monotonic=monotonic)
    b = elector(kube, "b", wall_clock=wall_clock, monotonic=monotonic)
    for _ in range(3):  # acquire, then renew twice: one line
        assert await a.try_acquire_or_renew()
        monotonic.advance(2)
    assert not await b.try_acquire_or_renew()  # a follower says nothing
    where = f"lease {kube.namespace}/leader"
    assert changes(caplog) == [(logging.INFO, f"a is now the leader ({where})")]
    caplog.clear()

    # The API refuses a's renewals (RBAC removed, say): past the 10 s renew deadline its
    # leadership lapses; that is logged once, on the round that notices it.
    kube.emulator.inject(Fault(verb="get", path="/leases/leader$", status=403, times=8))
    for _ in range(8):  # 16 s of failing rounds
        await a.try_acquire_or_renew()
        monotonic.advance(2)
    (lost,) = changes(caplog)
    assert lost[0] == logging.WARNING
    assert lost[1].startswith(f"a lost leadership of {where}: not renewed within 10 s "
                              "(lease read failed: ")
    assert not a.is_leader
    caplog.clear()

    # The API answers again and the Lease is still a's (b last saw it change 16 s ago,
    # so b takes over first): a sees it held by b and says nothing more.
    assert await b.try_acquire_or_renew()
    assert not await a.try_acquire_or_renew()
    assert changes(caplog) == [(logging.INFO, f"b is now the leader ({where})")]
    caplog.clear()

    # b is taken over while it believes it leads: one WARNING naming the new holder.
    monotonic.advance(16)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert changes(caplog) == [
        (logging.INFO, f"a is now the leader ({where})"),
        (logging.WARNING, f"b lost leadership of {where}: held by a; it stops scaling")]
    caplog.clear()

    # A clean release on shutdown is INFO, not a loss.
    await a.release()
    assert changes(caplog) == [(logging.INFO, f"a releases leadership of {where} (shutting down)")]
