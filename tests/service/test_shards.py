"""Several shards: each evaluates, leads and is signalled for its own models only, and any
instance answers the external metrics API for every model (`service.relay`).

End to end: a real nats-server, the Kubernetes API emulator (a controller writes status),
two services started as shards 0 and 1 of 2 from the same policy files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from scaler import emulator as kube_emulator
from scaler.actuators import settings as kube_settings
from scaler.core import backoff as core_backoff
from scaler.engine import types as engine_types
from scaler.policy import fleet as policy_fleet
from scaler.policy import shards
from scaler.service import arbiter as fleet_arbiter
from scaler.service import metrics_api, relay, runner, settings, tls
from scaler.signals import nats_core

from . import factories
from .test_end_to_end import POLICY, eventually, nats_url

FIXTURES = (nats_url,)  # the real nats-server of the end-to-end tests, used by name
NAMESPACE = "inference"
PREFIX = "scaler.shards"
NOW = 1_764_410_000.0


def one_model_per_shard(count: int) -> list[str]:
    """Model names, the k-th owned by shard k of `count` (each model is a domain alone)."""
    names: dict[int, str] = {}
    index = 0
    while len(names) < count:
        name = f"model-{index}"
        names.setdefault(shards.owner(shards.member(shards.MODEL, f"{NAMESPACE}/{name}"),
                                      shards=count), name)
        index += 1
    return [names[shard] for shard in range(count)]


# -- the relayed record: every field checked ------------------------------------------------

def served(**changes: Any) -> metrics_api.Served:
    base = metrics_api.Served(
        key=f"{NAMESPACE}/m", namespace=NAMESPACE, labels={"model": "m", "tenant": "t"},
        stale_after_s=30.0, desired=4, decided_at=NOW - 1.0,
        points={"scaler_queue_depth": metrics_api.MetricPoint(12.0, NOW - 1.5)})
    return metrics_api.Served(**{**{f: getattr(base, f) for f in base.__slots__}, **changes})


def decode(body: bytes, *, subject: str = f"{PREFIX}.decisions.{NAMESPACE}.m"
           ) -> metrics_api.Served:
    return relay.decode(body, subject=subject, prefix=PREFIX, now=NOW)


def test_a_record_round_trips() -> None:
    assert decode(relay.encode(served())) == served()
    assert decode(relay.encode(served(desired=None, points={}))).desired is None


def tampered(**fields: Any) -> bytes:
    body = json.loads(relay.encode(served()))
    body.update(fields)
    return json.dumps(body).encode()


@pytest.mark.parametrize(("body", "subject", "reason"), [
    (b"x" * (relay.MAX_RECORD_BYTES + 1), None, "too_large"),
    (b"{not json", None, "malformed"),
    (tampered(v=2), None, "malformed"),
    (tampered(points=[]), None, "malformed"),
    # The subject names the model: a record cannot speak for another one.
    (relay.encode(served()), f"{PREFIX}.decisions.{NAMESPACE}.other", "subject_mismatch"),
    (tampered(namespace="kube-system"), None, "subject_mismatch"),
    (tampered(labels={"a": 1}), None, "bad_labels"),
    (tampered(labels={f"k{i}": "v" for i in range(relay.MAX_LABELS + 1)}), None,
     "bad_labels"),
    (tampered(desired=-1), None, "implausible"),
    (tampered(desired=10**9), None, "implausible"),
    (tampered(desired=True), None, "implausible"),
    (tampered(stale_after_s=math.inf), None, "implausible"),
    (tampered(decided_at=NOW + 3600), None, "implausible"),
    (tampered(points={"scaler_queue_depth": [float("nan"), NOW]}), None, "implausible"),
    (tampered(points={"scaler_queue_depth": [1e308 * 10, NOW]}), None, "implausible"),
    (tampered(points={"scaler_gpu_memory": [1.0, NOW]}), None, "unknown_metric"),
])
def test_a_hostile_record_is_refused_with_its_reason(body: bytes, subject: str | None,
                                                     reason: str) -> None:
    with pytest.raises(relay.Refused) as refused:
        decode(body, subject=subject or f"{PREFIX}.decisions.{NAMESPACE}.m")
    assert refused.value.reason == reason


# -- two shards end to end ------------------------------------------------------------------

MODELS = one_model_per_shard(2)


@pytest.fixture
async def emulator() -> AsyncIterator[kube_emulator.KubeEmulator]:
    async with factories.cluster(dict.fromkeys(MODELS, 1), namespace=NAMESPACE,
                                 pods=True) as emu:
        yield emu


def shard_settings(sharding: settings.ShardingSettings, *, nats_url: str, kube_url: str,
                   policies: Path, certificate: tls.CertificatePair) -> settings.Settings:
    return settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(
            servers=(nats_url,), reconnect=core_backoff.Backoff(base_delay_s=0.05)),
        "kube": kube_settings.KubeSettings(
            host=kube_url, lease=kube_settings.LeaseSettings(
                namespace="scaler", retry_period_s=0.2, renew_deadline_s=5.0)),
        "http": settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": settings.MetricsApiSettings(
            host="127.0.0.1", port=0, cert_file=certificate.cert_file,
            key_file=certificate.key_file, authentication=False),
        "engine": settings.EngineSettings(backstop_tick_seconds=0.2, coalesce_seconds=0.05),
        "policies": settings.PolicySettings(paths=[policies], reload_poll_seconds=0.1),
        "sharding": sharding,
    })


def replicas(emu: kube_emulator.KubeEmulator, name: str) -> int:
    deployment = emu.store.get(emu.resource("apps", "deployments"), NAMESPACE, name)
    return int(deployment["spec"]["replicas"])


async def desired_of(service: runner.Service, name: str, http: aiohttp.ClientSession,
                     context: ssl.SSLContext) -> tuple[int, Any]:
    assert service.metrics_api is not None
    url = (f"{service.metrics_api.url}/apis/external.metrics.k8s.io/v1beta1/namespaces/"
           f"{NAMESPACE}/scaler_desired_replicas")
    async with http.get(url, params={"labelSelector": f"model={name}"},
                        ssl=context) as response:
        return response.status, await response.json()


Shards = Callable[..., AbstractAsyncContextManager[list[runner.Service]]]


@pytest.fixture
def start_shards(nats_url: str, emulator: kube_emulator.KubeEmulator, tmp_path: Path,
                 certificate: tls.CertificatePair) -> Shards:
    """Two services, shards 0 and 1, on the same policy files (`files`: name -> text,
    written before they start); each leading its own Lease when it is handed over."""

    @contextlib.asynccontextmanager
    async def start(files: dict[str, str], **sharding: Any
                    ) -> AsyncIterator[list[runner.Service]]:
        folder = tmp_path / "policies"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        services = [runner.Service(shard_settings(
            settings.ShardingSettings(shards=2, shard=shard, **sharding), nats_url=nats_url,
            kube_url=emulator.url, policies=folder, certificate=certificate))
            for shard in range(2)]
        try:
            for service in services:
                await service.start()
            for service in services:
                await eventually(lambda s=service: s.state.ready and bool(s.state.leader),
                                 what="each shard leads its own Lease")
                await service.wait_sources_ready()
                assert service.relay is not None
                await asyncio.wait_for(service.relay.ready.wait(), timeout=10)
            yield services
        finally:
            for service in services:
                await service.stop()

    return start


async def signal(nats_url: str, in_flight: Mapping[str, float], *, sources: int = 3) -> None:
    """`sources` replicas of each model report `in_flight` each."""
    client = await nats.connect(nats_url)
    try:
        for name, value in in_flight.items():
            for index in range(sources):
                await client.publish(f"scaler.signals.{NAMESPACE}.{name}", json.dumps({
                    "v": 1, "model": name, "namespace": NAMESPACE, "source": f"pod-{index}",
                    "ts": time.time(), "in_flight": value}).encode())
        await client.flush()
    finally:
        await client.close()


def policy_files(**extra: str) -> dict[str, str]:
    files = {f"{name}.yaml": POLICY.format(model=name, namespace=NAMESPACE, max=20)
             for name in MODELS}
    return {**files, **extra}


async def test_each_shard_leads_and_scales_its_own_models_and_answers_for_all(
    start_shards: Shards, nats_url: str, emulator: kube_emulator.KubeEmulator,
    client_ssl: ssl.SSLContext, http: aiohttp.ClientSession,
) -> None:
    async with start_shards(policy_files()) as services:
        # Each shard holds its own model alone, and its own Lease.
        assert [service.state.keys() for service in services] == [
            [f"{NAMESPACE}/{name}"] for name in MODELS]
        leases = emulator.resource("coordination.k8s.io", "leases")
        holders = {shard: emulator.store.get(leases, "scaler", f"scaler-leader-shard-{shard}")
                   ["spec"]["holderIdentity"] for shard in range(2)}
        assert holders == {shard: services[shard].identity for shard in range(2)}

        # Signals for both models (3 replicas each, 30 and 70 in flight at 10 a replica:
        # 9 replicas, and 21 held to max 20): each reaches and is decided by its own shard.
        await signal(nats_url, dict(zip(MODELS, (30.0, 70.0), strict=True)))
        await eventually(lambda: (replicas(emulator, MODELS[0]), replicas(emulator, MODELS[1]))
                         == (9, 20), what="each model scaled by its shard")
        for service, own in zip(services, MODELS, strict=True):
            source = service.source("nats")
            assert isinstance(source, nats_core.NatsCoreSource)
            # Subscribed to its own model's subject alone (not the default wildcard), so
            # NATS delivers the other shard's signals to that shard only.
            assert source.config.subjects() == {f"scaler.signals.{NAMESPACE}.{own}"}
            assert source.stats.accepted == 3 and not source.stats.dropped

        # Any shard answers the metrics API for every model: its own from its state, the
        # other's from the relay.
        async def both_answer() -> bool:
            for service in services:
                for name, expected in zip(MODELS, ("9", "20"), strict=True):
                    code, body = await desired_of(service, name, http, client_ssl)
                    if code != 200 or body["items"][0]["value"] != expected:
                        return False
            return True

        async with asyncio.timeout(10):
            while not await both_answer():
                await asyncio.sleep(0.02)

        # The decision API answers for its own models and says where the others are.
        assert services[0].http is not None
        other = f"{NAMESPACE}/{MODELS[1]}"
        async with http.get(f"{services[0].http.url}/v1/models/{other}/decision") as answer:
            assert answer.status == 404
            assert (await answer.json())["shards"] == {other: 1}

        # A forged record for the other shard's model under the wrong subject is counted.
        client = await nats.connect(nats_url)
        try:
            forged = relay.encode(metrics_api.Served(
                key=f"{NAMESPACE}/{MODELS[1]}", namespace=NAMESPACE, labels={},
                stale_after_s=30.0, desired=1, decided_at=time.time()))
            await client.publish(f"{PREFIX}.decisions.{NAMESPACE}.{MODELS[0]}", forged)
            await client.flush()
        finally:
            await client.close()
        relayed = services[0].relay
        assert relayed is not None
        await eventually(lambda: relayed.stats.dropped.get("subject_mismatch", 0) >= 1,
                         what="the forged record counted")
        code, body = await desired_of(services[0], MODELS[1], http, client_ssl)
        assert (code, body["items"][0]["value"]) == (200, "20")



BUDGET = """\
apiVersion: scaler.io/v1alpha1
kind: GpuBudget
metadata: {name: search}
spec: {tenant: search, guaranteedGpus: 0, maxGpus: 10}
"""


async def test_a_split_domain_is_arbitrated_by_one_shard_for_the_other(
    start_shards: Shards, nats_url: str, emulator: kube_emulator.KubeEmulator,
) -> None:
    # Both models are tenant search's, under one budget of 10 GPUs: one domain, split (more
    # than 1 model), so the budget's shard arbitrates it and the other shard evaluates both
    # models. They want 9 and 20 replicas of 1 GPU: together never more than 10.
    arbiter_shard = shards.owner(shards.member(shards.BUDGET, "search"), shards=2)
    async with start_shards(policy_files(**{"budget.yaml": BUDGET}),
                            max_domain_models=1) as services:
        arbiter, evaluator = services[arbiter_shard], services[1 - arbiter_shard]
        keys = [f"{NAMESPACE}/{name}" for name in MODELS]
        assert (arbiter.state.keys(), sorted(evaluator.state.keys())) == ([], sorted(keys))
        assert evaluator.reactor.arbiter.fleet.budgets == {}  # the budget is the arbiter's
        assert list(arbiter.reactor.arbiter.fleet.budgets) == ["search"]

        await signal(nats_url, dict(zip(MODELS, (30.0, 70.0), strict=True)))

        def counts() -> tuple[int, int]:
            return replicas(emulator, MODELS[0]), replicas(emulator, MODELS[1])

        await eventually(lambda: sum(counts()) == 10 and min(counts()) > 1,
                         what="the budget's 10 GPUs shared by both models")
        # Each was capped by the arbiter's grant, which says why (the patch lands before
        # the decision is recorded: wait for the record too).
        def capped_by_budget(key: str) -> bool:
            status = evaluator.state.status(key)
            last = None if status is None else status.last
            return last is not None and any(
                c.name == "external_budget" and "search" in c.detail
                for c in last.decision.clamps)

        await eventually(lambda: all(capped_by_budget(key) for key in keys),
                         what="both decisions capped by the budget's grant")
        assert set(arbiter.reactor.arbiter.foreign_grants()) == set(keys)
        # Signals keep coming; the sum never passes the budget.
        for _ in range(10):
            await signal(nats_url, dict(zip(MODELS, (30.0, 70.0), strict=True)))
            await asyncio.sleep(0.05)
            assert sum(counts()) <= 10


# -- asks and grants between shards: checked item by item -----------------------------------

class Message:
    """What the relay reads of a NATS message."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()
        self.subject = ""


def ask(key: str, **changes: Any) -> dict[str, Any]:
    item = {"model": key, "desired": 6, "current": 2, "replicas": 6, "forecast_replicas": 6,
            "excluded_gpus": 0, "at": NOW}
    return {**item, **changes}


def relay_with(share: shards.Share) -> tuple[relay.ShardRelay, list[str], list[str]]:
    """A relay of shard 0 of 2 (no connection: messages are handed to it), with what it
    woke: models asked for, models granted."""
    state = factories.loaded_state(factories.policy("own"))
    arbiter = fleet_arbiter.Arbiter()
    policies = {key: factories.policy(key.partition("/")[2]) for key in share.foreign}
    arbiter.set_fleet(policy_fleet.Fleet(), keys=state.keys(), remote=share.remote,
                      foreign=policies)
    asked: list[str] = []
    notified: list[str] = []
    shard_relay = relay.ShardRelay(
        settings.NatsSettings(), prefix=PREFIX, assignment=shards.Assignment(0, 2),
        state=state, arbitration=relay.Arbitration(
            arbiter, notify=notified.append, foreign_asked=lambda p: asked.append(p.key)),
        leading=lambda: True, clock=lambda: NOW)
    shard_relay.share = share
    return shard_relay, asked, notified


def share_of(*, remote: Mapping[str, int] = {}, foreign: Mapping[str, int] = {}
             ) -> shards.Share:
    return shards.Share(models=frozenset(), pools=frozenset(), budgets=frozenset(),
                        node_pools=frozenset(), remote=remote, foreign=foreign, domain_of={})


async def test_an_ask_is_taken_only_from_the_shard_that_evaluates_its_model() -> None:
    theirs = f"{NAMESPACE}/theirs"
    shard_relay, asked, _ = relay_with(share_of(foreign={theirs: 1}))
    await shard_relay._on_asks(Message({"v": 1, "from": 1, "asks": [
        ask(theirs), ask(f"{NAMESPACE}/stranger"), ask(theirs, desired=-3),
        ask(theirs, at=NOW + 3600), "junk"]}))
    await shard_relay._on_asks(Message({"v": 1, "from": 1, "asks": [ask(theirs, at=NOW - 9)]}))
    # A shard that does not evaluate the model cannot ask for it.
    await shard_relay._on_asks(Message({"v": 1, "from": 0, "asks": [ask(theirs, desired=9)]}))
    await shard_relay._on_asks(Message({"v": 1, "from": 7, "asks": [ask(theirs)]}))
    assert shard_relay.stats.accepted == 1 and asked == [theirs]
    assert shard_relay.stats.dropped == {"not_arbitrated_here": 2, "implausible": 3,
                                         "malformed": 1, "out_of_order": 1}
    arbitrated = {a.key: a for a in shard_relay._arbitration.arbiter.asks()}
    assert arbitrated[theirs].desired == 6  # the policy's floor and tier, the ask's numbers


async def test_a_grant_is_taken_only_from_the_shard_that_arbitrates_its_model() -> None:
    mine = f"{NAMESPACE}/own"
    shard_relay, _, notified = relay_with(share_of(remote={mine: 1}))
    grant = {"model": mine, "replicas": 4, "cap_gpus": 4, "reason": "capped by tenant t",
             "borrowed_gpus": 0}
    await shard_relay._on_grants(Message({"v": 1, "from": 0, "grants": [grant]}))
    await shard_relay._on_grants(Message({"v": 1, "from": 1, "grants": [
        {**grant, "model": f"{NAMESPACE}/other"}, {**grant, "cap_gpus": 10**12},
        {**grant, "reason": "x" * 5000}]}))
    assert shard_relay.stats.dropped == {"not_arbitrated_there": 2, "implausible": 1,
                                         "malformed": 1}
    assert notified == []
    await shard_relay._on_grants(Message({"v": 1, "from": 1, "grants": [grant]}))
    assert notified == [mine]
    capped = shard_relay._arbitration.arbiter.capped(
        factories.policy("own"), engine_types.ClusterState(current=2, ready=2), now=NOW)
    assert (capped.budget_gpus, capped.budget_reason) == (4, "capped by tenant t")


class Recorder:
    """A connected NATS client that keeps what is published."""

    is_connected = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, json.loads(data)))


async def test_asks_go_in_bounded_batches_to_their_arbiter_and_only_when_changed() -> None:
    keys = [f"{NAMESPACE}/m{index}" for index in range(1200)]
    shard_relay, _, _ = relay_with(share_of(remote=dict.fromkeys(keys, 1)))
    outbox = shard_relay._arbitration.arbiter.outbox
    for key in keys:
        outbox[key] = relay.decode_ask(ask(key), now=NOW)
    client = Recorder()
    shard_relay._client = client  # type: ignore[assignment]
    assert await shard_relay.send_asks() == 1200
    assert [(subject, len(body["asks"]), body["from"]) for subject, body in client.sent] == [
        (f"{PREFIX}.asks.1", 500, 0), (f"{PREFIX}.asks.1", 500, 0),
        (f"{PREFIX}.asks.1", 200, 0)]
    assert await shard_relay.send_asks() == 0  # nothing changed since
    outbox[keys[7]] = relay.decode_ask(ask(keys[7], desired=9), now=NOW)
    assert await shard_relay.send_asks() == 1
    assert client.sent[-1][1]["asks"] == [ask(keys[7], desired=9)]
