"""Decision history: the ring's bounds, the Events view, GET .../history, audit replay."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from scaler import cli
from scaler.actuators import base as actuators
from scaler.service import audit, explain, history, http_api, observability, reactor, web
from scaler.service import state as service_state
from scaler.signals import store

from . import factories
from .conftest import FakeClock
from .fakes import FakeCluster
from .test_reactor import KEY, policy, sample


def event(*, current: int = 3, desired: int = 3, recommendation: int | None = 3,
          held: bool = False, outcome: str | None = "unchanged") -> history.Event:
    return history.Event(
        reason=history.classify(current=current, desired=desired, held=held,
                                outcome=outcome),
        current=current, desired=desired, recommendation=recommendation,
        winner=None if held else "concurrency", held=held, clamps=(), outcome=outcome)


@pytest.mark.parametrize(
    ("current", "desired", "held", "outcome", "reason", "kind"),
    [
        (2, 5, False, "applied", "ScaledUp", "Normal"),
        (5, 2, False, "dry_run", "ScaledDown", "Normal"),
        (2, 5, False, "not_leader", "ScaledUp", "Normal"),
        (3, 3, False, "unchanged", "Held", "Normal"),
        (3, 3, True, "unchanged", "SignalsStale", "Warning"),
        (2, 5, False, "conflict", "FailedScale", "Warning"),
        (2, 5, False, "failed", "FailedScale", "Warning"),
        (2, 5, False, "skipped_hpa_owned", "ScalerSkipped", "Warning"),
        (2, 5, True, None, "ScaledUp", "Normal"),  # a fresh signal may scale up past stale ones
    ],
)
def test_classify(current: int, desired: int, held: bool, outcome: str | None, reason: str,
                  kind: str) -> None:
    found = history.classify(current=current, desired=desired, held=held, outcome=outcome)
    assert (found, found.type) == (reason, kind)


def test_repeats_merge_into_one_entry_with_a_count() -> None:
    ring = history.History()
    for tick in range(50):
        ring.add(event(), at=1000.0 + 15 * tick)
    ring.add(event(recommendation=2), at=2000.0)
    first, second = ring.entries()
    assert (first.count, first.first_at, first.last_at) == (50, 1000.0, 1000.0 + 15 * 49)
    assert (second.count, second.event.recommendation) == (1, 2)


def test_holds_are_bounded_by_count_and_never_push_out_the_hours_scale_events() -> None:
    ring = history.History()
    ring.add(event(current=2, desired=5, outcome="applied"), at=0.0)
    for tick in range(1, 1000):  # distinct holds (the recommendation moves), 1 s apart
        ring.add(event(recommendation=tick % 7), at=float(tick))
    entries = ring.entries()
    assert len(entries) == 1 + history.MAX_DECISIONS
    assert entries[0].event.reason is history.EventReason.SCALED_UP
    assert entries[-1].last_at == 999.0 and entries[1].last_at == 999.0 - 99
    # An hour and a second after it, the scale event is gone; the holds stay.
    ring.add(event(recommendation=9), at=history.SCALE_WINDOW_S + 1.0)
    assert all(not each.event.scale for each in ring.entries())
    assert len(ring) == history.MAX_DECISIONS


def test_scale_events_are_capped_within_the_hour() -> None:
    ring = history.History()
    for tick in range(400):  # a flapping model: a change every 5 s, 2000 s in all
        up = tick % 2 == 0
        ring.add(event(current=3 if up else 4, desired=4 if up else 3, outcome="applied"),
                 at=5.0 * tick)
    entries = ring.entries()
    assert len(entries) == history.MAX_SCALE_EVENTS
    assert entries[-1].last_at == 5.0 * 399 and entries[0].last_at == 5.0 * (400 - 256)
    assert [e.event.reason for e in ring.entries(2)] == ["ScaledUp", "ScaledDown"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-3, "0s"), (45, "45s"), (119, "119s"), (270, "4m30s"), (300, "5m"), (2700, "45m"),
     (12_000, "3h20m"), (108_000, "30h"), (273_600, "3d4h"), (3_888_000, "45d"),
     (70_000_000, "2y")],
)
def test_ages_read_as_kubectl_prints_them(seconds: float, text: str) -> None:
    assert explain.age(seconds) == text


def test_the_events_table() -> None:
    ring = history.History()
    clamp = history.ClampChange(name="rate_limit_up", before=9, after=6)
    scaled = history.Event(reason=history.EventReason.SCALED_UP, current=2, desired=6,
                           recommendation=9, winner="queue_depth", held=False,
                           clamps=(clamp,), outcome="applied")
    ring.add(scaled, at=factories.NOW - 600)
    for tick in range(3):
        ring.add(event(current=6, desired=6, held=True, recommendation=None),
                 at=factories.NOW - 60 + 15 * tick)
    document = explain.history_document(KEY, ring.entries(), now=factories.NOW, kept=len(ring))
    lines = explain.events_table(document).splitlines()
    assert lines[0] == "Events (all kept, newest last, ages at 2025-11-29T09:53:20Z):"
    assert lines[1].split() == ["Type", "Reason", "Age", "Message"]
    assert lines[3].split(None, 3) == [
        "Normal", "ScaledUp", "10m",
        "Scaling up from 2 to 6: demand says 9 (the waiting queue), the scale-up rate limit "
        "allows 6."]
    assert lines[4].split(None, 6)[:6] == ["Warning", "SignalsStale", "30s", "(x3", "over",
                                           "30s)"]
    assert "missing data never scales down" in lines[4]
    # The columns line up: every message starts where the header's does.
    assert len({line.index(word) for line, word in
                zip(lines[1:], ["Message", "-------", "Scaling", "Holding"],
                    strict=True)}) == 1
    assert explain.events_table({**document, "events": []}) == "Events:  <none>"


# -- the service: a real reactor, engine and signal store; audit log and replay ----------


async def run_service(*, clock: FakeClock, audit_path: Path
                      ) -> tuple[service_state.ServiceState, FakeCluster]:
    """Scale up, hold, a conflicting patch, a stale spell and a scale-down, audited."""
    cluster = FakeCluster()
    log = audit.AuditLog(audit_path, max_bytes=1 << 20, backups=1)
    signals = store.SignalStore()
    registry = factories.loaded_state(policy())
    loop_reactor = reactor.Reactor(state=registry, store=signals, reader=cluster,
                                   actuator=cluster, wall_clock=clock, backstop_s=5.0,
                                   audit=log)
    try:
        loop_reactor.set_policies({KEY: policy()})
        await loop_reactor.idle()
        for step, in_flight in enumerate([30.0, 30.0, 30.0, 80.0, 80.0, 10.0, 10.0]):
            clock.now += 15.0
            signals.put([sample(clock=clock, source="a", in_flight=in_flight)])
            if step == 3:
                cluster.outcomes = [actuators.Outcome.CONFLICT]
            await loop_reactor.evaluate(KEY)
        clock.now += 100.0  # no sample for 100 s: stale, held
        await loop_reactor.evaluate(KEY)
        clock.now += 400.0  # past the 300 s down window
        signals.put([sample(clock=clock, source="a", in_flight=10.0)])
        await loop_reactor.evaluate(KEY)
    finally:
        log.close()
    return registry, cluster


async def test_the_service_keeps_the_history_and_the_audit_log_replays_to_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "decisions.jsonl"
    registry, cluster = await run_service(clock=clock, audit_path=path)
    entries = registry.history(KEY)
    assert entries is not None
    reasons = [(e.event.reason, e.event.current, e.event.desired, e.count) for e in entries]
    assert reasons == [
        ("SignalsStale", 2, 2, 1),  # the first evaluation, before any sample
        ("ScaledUp", 2, 3, 1),
        ("Held", 3, 3, 2),
        ("FailedScale", 3, 8, 1),  # conflict: not written, decided again next time
        # The look-ahead reads 9.x replicas (30 -> 80 in flight is a climb): 9 hold it
        # within the tolerance, and a rise buys that.
        ("ScaledUp", 3, 9, 1),
        ("Held", 9, 9, 2),  # the down window holds 9
        ("SignalsStale", 9, 9, 1),
        ("ScaledDown", 9, 1, 1),
    ]
    assert [d.desired for d in cluster.applied] == [3, 8, 9, 1]
    replayed = history.replay([path])
    assert replayed.skipped == () and replayed.lines == 10
    assert replayed.histories[KEY].entries() == entries


async def test_replay_skips_and_names_truncated_and_corrupt_lines(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "decisions.jsonl"
    await run_service(clock=clock, audit_path=path)
    lines = path.read_text().splitlines()
    broken = {**json.loads(lines[2]), "decision": {**json.loads(lines[2])["decision"],
                                                   "current": "three"}}
    # Line 3 has a wrong type, line 6 is garbage, line 8 is blank, the last one is torn.
    corrupt = [*lines[:2], json.dumps(broken), *lines[3:5], "\x00\x00garbage", lines[5],
               "", *lines[6:], lines[-1][: len(lines[-1]) // 2]]
    path.write_text("\n".join(corrupt))  # a torn write ends without its newline
    replayed = history.replay([path])
    assert [(each.line, each.why.split(" (")[0]) for each in replayed.skipped] == [
        (3, "decision.current: expected int, got str"), (6, "not JSON"), (13, "not JSON")]
    assert replayed.lines == 12
    # What is left is what the readable lines alone give.
    readable = tmp_path / "readable.jsonl"
    readable.write_text("\n".join([*lines[:2], *lines[3:]]) + "\n")
    assert replayed.histories[KEY].entries() == history.replay([readable]).histories[
        KEY].entries()
    # The CLI: the same view, the skipped lines named on stderr, exit 0.
    code = await asyncio.to_thread(cli.main, ["explain", "--audit", str(path), "llama-70b",
                                              "--history", "3"])
    captured = capsys.readouterr()
    assert code == 0
    assert f"skipped 3 of 12 lines (truncated or corrupt): {path}:3: decision.current" in (
        captured.err)
    assert f"{path}:6: not JSON" in captured.err and f"{path}:13: not JSON" in captured.err
    out = captured.out.splitlines()
    assert out[0] == "inference/llama-70b:"
    assert out[1].startswith("Events (3 of 8 kept, newest last, ages at ")
    assert [line.split()[1] for line in out[4:]] == ["Held", "SignalsStale", "ScaledDown"]


async def test_replay_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    code = await asyncio.to_thread(cli.main, ["explain", "--audit", str(missing)])
    assert code == 2 and "cannot read the audit log" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("not json\n")
    code = await asyncio.to_thread(cli.main, ["explain", "--audit", str(empty)])
    err = capsys.readouterr().err
    assert code == 1 and f"{empty}:1: not JSON" in err and "no decisions for any model" in err
    code = await asyncio.to_thread(cli.main, ["explain"])
    assert code == 2 and "name a MODEL" in capsys.readouterr().err


# -- GET /v1/models/.../history and `scaler explain --history N` -------------------------


@contextlib.asynccontextmanager
async def serving(registry: service_state.ServiceState, clock: FakeClock
                  ) -> AsyncIterator[web.RunningServer]:
    api = http_api.HttpApi(registry, registry=observability.make_registry(registry, clock=clock),
                           clock=clock)
    running = await web.serve(api.app(), host="127.0.0.1", port=0)
    try:
        yield running
    finally:
        await running.close()


@pytest.fixture
async def served(tmp_path: Path, clock: FakeClock
                 ) -> AsyncIterator[tuple[web.RunningServer, service_state.ServiceState]]:
    registry, _ = await run_service(clock=clock, audit_path=tmp_path / "decisions.jsonl")
    async with serving(registry, clock) as running:
        yield running, registry


@pytest.mark.parametrize(
    ("path", "code", "fragment"),
    [
        ("/v1/models/inference/llama-70b/history?limit=3", 200, "inference/llama-70b"),
        ("/v1/models/llama-70b/history", 200, "inference/llama-70b"),
        ("/v1/models/inference/llama-70b/history?limit=0", 400, "from 1 to 356, got '0'"),
        ("/v1/models/inference/llama-70b/history?limit=357", 400, "got '357'"),
        ("/v1/models/inference/llama-70b/history?limit=-1", 400, "got '-1'"),
        ("/v1/models/inference/llama-70b/history?limit=ten", 400, "got 'ten'"),
        ("/v1/models/inference/gpt-5/history", 404, "no policy for model inference/gpt-5"),
        ("/v1/models/gpt-5/history", 404, "any namespace"),
    ],
)
async def test_history_api(
    served: tuple[web.RunningServer, service_state.ServiceState],
    http: aiohttp.ClientSession, clock: FakeClock, path: str, code: int, fragment: str,
) -> None:
    server, _ = served
    async with http.get(server.url + path) as response:
        assert response.status == code
        body = await response.json()
    assert fragment in (body["model"] if code == 200 else body["error"])
    if code == 200:
        expected = 3 if "limit=3" in path else http_api.HISTORY_LIMIT_DEFAULT
        assert len(body["events"]) == min(expected, 8) and body["kept"] == 8
        assert body["now"] == clock.now
        newest = body["events"][-1]
        assert (newest["type"], newest["reason"], newest["current"], newest["desired"]) == (
            "Normal", "ScaledDown", 9, 1)
        assert newest["message"].startswith("Scaling down from 9 to 1: demand says 1")


async def test_a_name_in_several_namespaces_is_a_conflict(
    http: aiohttp.ClientSession, clock: FakeClock
) -> None:
    registry = factories.loaded_state(factories.policy("shared"),
                                      factories.policy("shared", namespace="staging"))
    async with serving(registry, clock) as running:
        async with http.get(running.url + "/v1/models/shared/history") as response:
            assert response.status == 409
            assert (await response.json())["candidates"] == ["inference/shared",
                                                             "staging/shared"]
        async with http.get(running.url + "/v1/models/staging/shared/history") as response:
            assert response.status == 200 and (await response.json())["events"] == []


async def test_explain_with_history(
    served: tuple[web.RunningServer, service_state.ServiceState],
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, _ = served
    code = await asyncio.to_thread(cli.main, ["explain", "llama-70b", "--history", "2",
                                              "--url", server.url])
    out = capsys.readouterr().out
    assert code == 0
    decision, events = out.split("\n\n")
    assert decision.startswith("inference/llama-70b at ") and "Signals:" in decision
    rows = events.splitlines()
    assert rows[0].startswith("Events (2 of 8 kept")
    assert [row.split()[:3] for row in rows[3:]] == [["Warning", "SignalsStale", "6m40s"],
                                                     ["Normal", "ScaledDown", "0s"]]
    code = await asyncio.to_thread(cli.main, ["explain", "inference/llama-70b", "--history",
                                              "1", "--url", server.url, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["decision"]["decision"]["desired"] == 1
    assert [e["reason"] for e in document["history"]["events"]] == ["ScaledDown"]
    code = await asyncio.to_thread(cli.main, ["explain", "llama-70b", "--history", "1000",
                                              "--url", server.url])
    assert code == 2 and "--history: expected 1 to 356" in capsys.readouterr().err
