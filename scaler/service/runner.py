"""`scaler run`: wires policies, signal sources, store, reactor, actuators and the HTTP APIs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import shutil
import signal
import socket
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scaler.actuators import authn as delegated
from scaler.actuators import base as actuators
from scaler.actuators import client as kube_client
from scaler.actuators import cluster_reader as kube_reader
from scaler.actuators import configmap as kube_configmap
from scaler.actuators import deletion_cost, wiring
from scaler.actuators import leader as kube_leader
from scaler.actuators import policy_resources as kube_policies
from scaler.actuators import resources as kube_resources
from scaler.actuators import settings as kube_settings
from scaler.core import vocabulary
from scaler.engine import spare, types
from scaler.policy import model, shards
from scaler.service import audit as audit_log
from scaler.service import (
    authn,
    conditions,
    http_api,
    metrics_api,
    observability,
    policies,
    reactor,
    relay,
    tasks,
    tls,
    web,
)
from scaler.service import learned as service_learned
from scaler.service import settings as service_settings
from scaler.service import state as service_state
from scaler.signals import (
    http_push,
    messages,
    nats_core,
    prometheus,
    registry,
    samples,
    source,
    store,
)

log = logging.getLogger(__name__)

GC_YOUNG_THRESHOLD = 20_000
"""Net allocations of tracked objects between young collections (CPython's default: 700).

An evaluation allocates a few hundred objects (the decision and its explanation, the
engine state, the history entry) and keeps a few dozen of them until the model's next
one, so at 700 young collections ran every few dozen evaluations and promoted the kept
objects, and full collections walked every model's state: at 10,000 models, 1.8 to
2.4 s of collector in a 7 to 9 s evaluation cycle (two or three full collections of 0.5
to 0.7 s each). At 3,000 models, 0.3 to 0.5 s a cycle at 700 and 0.08 to 0.19 s at
20,000 (bench/fleet_scale.py, docs/scaling.md)."""


def tune_collector() -> None:
    """Once start-up is done: move what it allocated (it lives for the process) out of the
    collector's sight, and collect the young generation every GC_YOUNG_THRESHOLD
    allocations. Without the freeze, full collections over the start-up objects paused
    the loop 20 to 90 ms under load (bench/signals_ingest.py)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def for_shard(kube: kube_settings.KubeSettings, assignment: shards.Assignment
              ) -> kube_settings.KubeSettings:
    """The Kubernetes settings of one shard: its own Lease (`<name>-shard-<k>`), so each
    shard elects its own leader, and so its own learned-state ConfigMap (named after the
    Lease unless named: then that name gets the suffix too). One shard: unchanged."""
    if not assignment.sharded:
        return kube
    suffix = f"-shard-{assignment.shard}"
    learned = kube.learned_state
    if learned.name is not None:
        learned = learned.model_copy(update={"name": learned.name + suffix})
    return kube.model_copy(update={
        "lease": kube.lease.model_copy(update={"name": kube.lease.name + suffix}),
        "learned_state": learned})


def default_identity() -> str:
    """The pod name (its hostname) plus a random suffix, unique across restarts."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


Announce = Callable[[model.ScalePolicy, str, str], Awaitable[None]]
"""Post a Warning about a policy's target: (policy, reason, message)."""


@dataclass
class ClusterBackend:
    """What the service reads and changes a cluster through: Kubernetes (`kubernetes_backend`)
    or a simulated cluster behind the same protocols (a demo, a test)."""

    reader: actuators.ClusterReader
    actuator: actuators.ReplicaActuator
    leader: actuators.LeaderElector
    pool_actuators: Mapping[str, actuators.NodePoolActuator] = field(default_factory=dict)
    announce: Announce | None = None
    close: Callable[[], Awaitable[None]] | None = None
    update: Callable[[Sequence[model.ScalePolicy]], Awaitable[None]] | None = None
    """Called with the policies in force on every (re)load: Kubernetes watches pods only in
    their namespaces."""
    delegation: delegated.Delegation | None = None
    """Who authenticates and authorises the external metrics API's callers (the API server
    through TokenReview and SubjectAccessReview); None: nobody can (a simulated cluster)."""
    policy_resources: kube_policies.PolicyResources | None = None
    """ScalePolicy resources, a policy source beside the files (`policies.resources`)."""
    status_writer: kube_policies.StatusWriter | None = None
    deletion_costs: deletion_cost.DeletionCoster | None = None
    """Writes pod deletion costs before scale-downs (`kube.deletion_cost`); its counts go
    to /metrics."""
    learned: kube_configmap.ConfigMapStore | None = None
    """Where the engine's learned state is kept across restarts (`kube.learned_state`);
    None: not kept (a simulated cluster, or the setting off)."""


async def kubernetes_backend(
    settings: kube_settings.KubeSettings, *, wall_clock: Callable[[], float], identity: str,
    policy_settings: service_settings.PolicySettings | None = None,
    work: deletion_cost.WorkReader | None = None,
) -> ClusterBackend:
    """The Kubernetes adapters (`actuators.wiring`) over one API client, watches started;
    with `policies.resources`, the ScalePolicy resources too (listed before this returns).
    `work`: each replica's reported work, for pod deletion costs before a scale-down."""
    adapters = await wiring.connect(settings, identity=identity, wall_clock=wall_clock,
                                    work=work)
    resources = writer = None
    try:
        await adapters.start()
        if policy_settings is not None and policy_settings.resources:
            resources = kube_policies.PolicyResources(adapters.api, settings=settings)
            await resources.start(timeout_s=settings.request_timeout_s)
            loop = asyncio.get_running_loop()
            writer = kube_policies.StatusWriter(
                adapters.api, leader=adapters.leader, clock=loop.time,
                min_interval_s=policy_settings.status_min_interval_seconds,
                transitions=conditions.transitions, recorder=adapters.recorder)
    except BaseException:
        if resources is not None:
            await resources.stop()
        await adapters.api.api_client.close()
        raise

    async def close() -> None:
        if resources is not None:
            await resources.stop()
        await adapters.close()

    async def announce(policy: model.ScalePolicy, reason: str, message: str) -> None:
        ref = kube_resources.target_ref(policy, plurals=settings.resource_plurals)
        await adapters.recorder.record(ref, reason=reason, message=message, warning=True)

    return ClusterBackend(reader=adapters.reader, actuator=adapters.replicas,
                          leader=adapters.leader, pool_actuators=adapters.pools,
                          announce=announce, close=close, update=adapters.update,
                          delegation=delegated.KubeDelegation(adapters.api),
                          policy_resources=resources, status_writer=writer,
                          deletion_costs=adapters.replicas.deletion_costs,
                          learned=adapters.learned)


class Service:
    """The running service. `start()` brings everything up; `stop()` drains it in order.

    Shutdown order: readiness fails; sources stop (no new samples); the policy watcher and
    the backstop tick stop; running evaluations finish their patches (up to
    `drain_timeout_s`); the Lease is released so a follower takes over at once; then the
    cluster watches, the servers and the API client close.
    """

    def __init__(
        self,
        settings: service_settings.Settings,
        *,
        wall_clock: Callable[[], float] = samples.wall_clock,
        identity: str | None = None,
        drain_timeout_s: float = 10.0,
        backend: ClusterBackend | None = None,
    ) -> None:
        self.assignment = shards.Assignment(shard=settings.sharding.shard,
                                            shards=settings.sharding.shards)
        self.settings = settings.model_copy(
            update={"kube": for_shard(settings.kube, self.assignment)})
        self.backend = backend
        self.wall_clock = wall_clock
        self.identity = identity or default_identity()
        self.drain_timeout_s = drain_timeout_s
        self.state = service_state.ServiceState()
        self.state.shard = self.assignment.shard
        self.store = store.SignalStore(limits=settings.signals.store_limits())
        self.supervisor = tasks.Supervisor()
        self.http: web.RunningServer | None = None
        self.push_server: web.RunningServer | None = None
        self.metrics_api: web.RunningServer | None = None
        self._cert_dir: Path | None = None
        self._audit: audit_log.AuditLog | None = None
        self._stopped = False
        self._takeover: asyncio.Task[None] | None = None
        # The learned state's last write (what was learned, the records carried over) and
        # when it was made.
        self._learned_written: tuple[dict[str, types.Learned], dict[str, str]] | None = None
        self._learned_written_at = float("-inf")
        self.gpu_telemetry: prometheus.GpuTelemetryPoller | None = None
        # The model keys this shard evaluates (with several shards, the others' resource
        # statuses are left to their shards), and what it tells the other shards and
        # hears from them (`service.relay`; None with one shard).
        self.owned: frozenset[str] = frozenset()
        self.relay: relay.ShardRelay | None = None

    # -- start --------------------------------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        if settings.audit.path is not None:
            self._audit = audit_log.AuditLog(settings.audit.path,
                                             max_bytes=settings.audit.max_bytes,
                                             backups=settings.audit.backups)
        if self.backend is None:
            self.backend = await kubernetes_backend(settings.kube, wall_clock=self.wall_clock,
                                                    identity=self.identity,
                                                    policy_settings=settings.policies,
                                                    work=self.pod_work)
        backend = self.backend
        self.leader = backend.leader
        if backend.deletion_costs is not None:
            self.state.deletion_costs = backend.deletion_costs.counts.copy
        if settings.prometheus.dcgm.enabled:
            # GPU health and SM activity for the reader: faulty GPUs leave pool capacity,
            # SM activity measures useful GPU-hours (docs/kubernetes.md).
            self.gpu_telemetry = prometheus.GpuTelemetryPoller(settings.prometheus,
                                                               clock=self.wall_clock)
            if isinstance(backend.reader, kube_reader.KubeClusterReader):
                backend.reader.telemetry = self.gpu_telemetry.latest
        self.reactor = reactor.Reactor(
            state=self.state, store=self.store,
            reader=deletion_cost.BusyReader(backend.reader, work=self.pod_work),
            actuator=backend.actuator, wall_clock=self.wall_clock,
            backstop_s=settings.engine.backstop_tick_seconds,
            coalesce_s=settings.engine.coalesce_seconds, audit=self._audit,
            pool_actuators=backend.pool_actuators)
        self.store.add_listener(self.reactor.notify)

        # Sources start with no routes; the first policy load gives them their config.
        group, limits = settings.nats, settings.signals
        push = None
        if settings.http.push_token is not None:
            push = http_push.HttpPushConfig(
                token=settings.http.push_token.get_secret_value(), known={},
                max_body_bytes=limits.push_max_body_bytes, max_items=limits.push_max_items,
                limits=limits.message_limits())
        self.sources = registry.build(registry.SourceSettings(
            nats=group, prometheus=settings.prometheus, push=push,
            # A shard subscribes to its own models' subjects only, so NATS routes each
            # message to the shard that owns it (docs/scaling.md).
            subscribe=nats_core.NatsCoreConfig(prefix=group.subject_prefix,
                                               wildcard=group.wildcard
                                               and not self.assignment.sharded,
                                               queue_group=group.queue_group,
                                               limits=limits.message_limits())),
            clock=self.wall_clock)
        for each in self.sources:
            self.state.add_drop_counter(each.name, _dropped(each.stats))
            self.state.add_source_health(each.name, _health(each.stats))
        # Samples the store refused (a full model refuses new sources), beside the drops.
        self.state.add_drop_counter("store", lambda: dict(self.store.refused))
        if self.assignment.sharded:
            self.relay = relay.ShardRelay(
                group, prefix=settings.sharding.subject_prefix, assignment=self.assignment,
                state=self.state, leading=lambda: bool(self.state.leader),
                arbitration=relay.Arbitration(self.reactor.arbiter, notify=self.reactor.notify,
                                              foreign_asked=self.reactor.foreign_asked),
                clock=self.wall_clock)
            self.state.add_drop_counter(relay.MEMBER, _dropped(self.relay.stats))
            self.state.add_source_health(relay.MEMBER, _health(self.relay.stats))

        await self._serve()
        if backend.learned is not None:
            # Before the policies: a model's first evaluation starts from what was learned.
            await self._resume_learned(backend.learned)
        # Policies before leadership: a new leader must know what it leads.
        self.watcher = policies.PolicyWatcher(
            settings.policies.paths, poll_seconds=settings.policies.reload_poll_seconds,
            apply=self._apply_policies, max_file_bytes=settings.policies.max_file_bytes,
            resources=backend.policy_resources)
        await self.watcher.load_now()
        start = self.supervisor.start
        start("leader", self._lead())
        if backend.policy_resources is not None and backend.status_writer is not None:
            start("policy-status", self._write_statuses(backend.policy_resources,
                                                        backend.status_writer))
        for each in self.sources:
            start(_task_name(each), each.run(self.store))
        if self.gpu_telemetry is not None:
            start("dcgm-telemetry", self.gpu_telemetry.run())
        if self.relay is not None:
            start(relay.MEMBER, self.relay.run())
        if backend.learned is not None:
            start("learned-state", self._keep_learned(backend.learned))
        start("policy-watcher", self.watcher.run())
        start("reactor-backstop", self.reactor.run())
        start("store-expiry", self._expire())
        log.info("scaler started", extra={"identity": self.identity,
                                          "http": self.http.url if self.http else None})

    async def wait_sources_ready(self) -> None:
        """Until every source receives what it will (NATS subscribed)."""
        for each in self.sources:
            await each.wait_ready()

    def pod_work(self, policy: model.ScalePolicy) -> dict[str, spare.PodWork]:
        """Each replica's fresh work (in flight and queued) by its pod name (the `source`
        of its signal messages), now. A source the policy names in `sharedQueueSources`
        is no replica: its queue is lost with no pod's removal."""
        now, stale = self.wall_clock(), policy.spec.stale_after_seconds
        shared = messages.shared_queue_keys(policy.spec.sources.shared_queue_sources)

        def per_replica(signal: vocabulary.Signal) -> dict[str, float]:
            values: dict[str, float] = {}
            for origin, value in self.store.per_source(policy.key, signal, now=now,
                                                       stale_after_s=stale).items():
                replica = None if origin in shared else messages.replica_of(origin)
                if replica is not None:  # one pod over both NATS and HTTP: counted once
                    values[replica] = max(value, values.get(replica, 0.0))
            return values

        return spare.work_by_source(in_flight=per_replica(vocabulary.Signal.IN_FLIGHT),
                                    queue_depth=per_replica(vocabulary.Signal.QUEUE_DEPTH))

    def source(self, name: str) -> source.SignalSource:
        """The running source called `name` ('nats', 'jetstream', 'prometheus', 'http')."""
        for each in self.sources:
            if each.name == name:
                return each
        raise KeyError(f"no signal source {name!r}")

    async def _serve(self) -> None:
        settings = self.settings
        metrics_registry = observability.make_registry(self.state, clock=self.wall_clock)
        app = http_api.HttpApi(self.state, registry=metrics_registry,
                               clock=self.wall_clock).app()
        group = settings.http
        pair = group.tls_pair()
        http_context = None if pair is None else tls.server_context(pair)
        push_app = app if group.push_port is None else web.new_app()
        for each in self.sources:
            if isinstance(each, http_push.HttpPushSource):
                each.mount(push_app)
        self.http = await web.serve(app, host=group.host, port=group.port,
                                    ssl_context=http_context)
        if push_app is not app and group.push_port is not None:
            self.push_server = await web.serve(push_app, host=group.host, port=group.push_port,
                                               ssl_context=http_context)
        if settings.metrics_api.enabled:
            gate = await self._gate()
            api = metrics_api.MetricsApi(
                self.state, clock=self.wall_clock, gate=gate,
                relayed=self.relay.relayed if self.relay is not None else None)
            context = tls.server_context(await self._certificate(),
                                         client_cas=gate.trust.ca_bundle if gate else "")
            self.metrics_api = await web.serve(
                api.app(), host=settings.metrics_api.host, port=settings.metrics_api.port,
                ssl_context=context)

    async def _gate(self) -> authn.Gate | None:
        return await authn.make_gate(
            self.backend.delegation if self.backend is not None else None,
            enabled=self.settings.metrics_api.authentication)

    async def _certificate(self) -> tls.CertificatePair:
        group = self.settings.metrics_api
        given = group.tls_pair()
        if given is not None:
            return given
        self._cert_dir = Path(tempfile.mkdtemp(prefix="scaler-tls-"))
        log.warning("external metrics API: no certificate given, using a self-signed one "
                    "(development only)")
        return await tls.self_signed(self._cert_dir, hosts=group.self_signed_hosts)

    async def _apply_policies(self, policy_set: policies.PolicySet) -> None:
        """Hand a new policy set to every part that depends on it (with several shards,
        the part this shard evaluates)."""
        every = {key: item.policy for key, item in policy_set.policies.items()}
        share = None
        if self.assignment.sharded:
            parts = shards.split(every.values(), policy_set.fleet,
                                 shards=self.assignment.shards,
                                 max_domain_models=self.settings.sharding.max_domain_models)
            share = parts[self.assignment.shard]
            self.state.shard_of = {key: index for index, part in enumerate(parts)
                                   for key in part.models}
            policy_set = policies.only(policy_set, share)
            log.info("shard %d of %d: %d models (%d arbitrated by other shards), %d pools, "
                     "%d budgets, %d other shards' models arbitrated here",
                     self.assignment.shard, self.assignment.shards, len(share.models),
                     len(share.remote), len(share.pools), len(share.budgets),
                     len(share.foreign))
        self.owned = frozenset(policy_set.policies)
        loaded = list(policy_set.policies.values())
        in_force = [item.policy for item in loaded]
        previous = set(self.state.keys())
        self.state.set_policies(in_force, status=service_state.PolicyLoadStatus(
            at=self.wall_clock(), policies=len(in_force), errors=policy_set.errors,
            kept=policy_set.kept))
        for gone in previous - {policy.key for policy in in_force}:
            self.store.forget(gone)
        # Stale values are retained (to be reported as stale) for twice the longest limit.
        longest = max((policy.spec.stale_after_seconds for policy in in_force), default=0.0)
        self.store.limits = dataclasses.replace(
            self.store.limits, ttl_s=max(self.settings.signals.retain_seconds, 2 * longest))
        for each in self.sources:
            await each.update(in_force)
        if self.backend is not None and self.backend.update is not None:
            await self.backend.update(in_force)
        self.reactor.planned_pools = None if share is None else share.node_pools
        self.reactor.set_policies(
            {policy.key: policy for policy in in_force}, fleet=policy_set.fleet,
            remote=() if share is None else share.remote,
            foreign=None if share is None else {key: every[key] for key in share.foreign})
        if self.relay is not None:
            self.relay.share = share
        announce = self.backend.announce if self.backend is not None else None
        for key in policy_set.kept:
            policy = self.state.policy(key)
            if policy is None or announce is None or not self.leader.is_leader:
                continue
            problems = "; ".join(str(e) for e in policy_set.errors
                                 if e.path == policy_set.policies[key].path)
            await announce(policy, "PolicyInvalid",
                           f"new version of policy {key} is invalid, the last good one "
                           f"stays: {problems}")

    async def _lead(self) -> None:
        """Take part in the election and keep the service state's view of it current."""
        leader = self.leader
        if isinstance(leader, kube_leader.LeaseElector):
            await self._lead_lease(leader)
        self.state.set_leader(leader.is_leader)
        await leader.run()
        await asyncio.Future()  # AlwaysLeader.run returns at once; stay until stopped

    async def _lead_lease(self, leader: kube_leader.LeaseElector) -> None:
        # The elector's own `run` loop, plus the readiness flag and a re-evaluation of
        # every model on becoming leader (decisions made as a follower were not applied).
        while True:
            was = self.state.leader
            leading = await leader.try_acquire_or_renew()
            self.state.set_leader(leading)
            if leading and was is False and self.settings.nats.queue_group is not None:
                self._takeover = asyncio.create_task(self._take_over_from_a_share(),
                                                     name="take-over")
            elif leading and not was:
                self.reactor.notify_all()
            await asyncio.sleep(leader.settings.retry_period_s)

    async def _write_statuses(self, resources: kube_policies.PolicyResources,
                              writer: kube_policies.StatusWriter) -> None:
        """At the backstop tick's pace: each ScalePolicy resource's status from the latest
        decision and the latest load (the writer keeps to its rate limit, leader only)."""
        while True:
            await asyncio.sleep(self.settings.engine.backstop_tick_seconds)
            current = self.watcher.current
            by_path = {item.path: item.policy for item in current.policies.values()}
            # With several shards each writes its own models' statuses; the first also
            # those of resources that are no model (invalid) and of pools and budgets.
            first = self.assignment.shard == 0
            for path, obj in resources.objects().items():
                meta = obj.get("metadata") or {}
                policy = by_path.get(path)
                owned = policy.key in self.owned if policy is not None else first
                if not owned:
                    continue
                status = self.state.status(policy.key) if policy is not None else None
                # Its own errors, and a collision it won (the other side names it).
                problems = [error for error in current.errors if error.path == path or (
                    error.reason == "duplicate" and f"in {path} (" in error.message)]
                previous = writer.last(path) or obj.get("status")
                body = conditions.status(
                    policy, status.last if status is not None else None, problems=problems,
                    previous=previous, generation=meta.get("generation"),
                    now=self.wall_clock(),
                    last_scale_at=status.last_scale_at if status is not None else None,
                    variant_costs=status.variant_costs if status is not None else None)
                await writer.write(namespace=str(meta.get("namespace")),
                                   name=str(meta.get("name")), status=body,
                                   uid=meta.get("uid"), notes=conditions.notes(previous, body))
            # GpuPools and GpuBudgets: their Valid condition (cluster-scoped: no Events).
            in_force = ({item.path for item in current.pools.values()}
                        | {item.path for item in current.budgets.values()})
            for path, (kind, obj) in (resources.fleet_objects().items() if first else ()):
                meta = obj.get("metadata") or {}
                body = conditions.fleet_status(
                    [error for error in current.errors if error.path == path],
                    in_force=path in in_force, previous=writer.last(path) or obj.get("status"),
                    generation=meta.get("generation"), now=self.wall_clock())
                await writer.write(namespace=None, name=str(meta.get("name")), status=body,
                                   kind=kind)

    async def _resume_learned(self, store: kube_configmap.ConfigMapStore, *,
                              taking_over: bool = False) -> None:
        """Read what an earlier instance (or, `taking_over`, the last leader) learned
        (`kube.learned_state`); each model takes its record at its next evaluation. A
        failed read is logged: models go on with what they learned here, or learn anew."""
        try:
            data = await store.read()
        except Exception as error:  # the API down at start must not stop the service
            log.warning("learned state: cannot read ConfigMap %s/%s: %s; %s%s",
                        store.namespace, store.name, error,
                        "models keep what they learned here" if taking_over
                        else "every model learns anew",
                        _LEARNED_GRANT if _forbidden(error) else "")
            data = {}
        self.reactor.resume = service_learned.Resume(
            data, max_age_s=self.settings.kube.learned_state.max_age_seconds,
            counts=self.state.learned_records)
        log.info("learned state: %d records in ConfigMap %s/%s", len(data), store.namespace,
                 store.name)

    async def _take_over_from_a_share(self) -> None:
        """A follower in a NATS queue group received a share of the signals, so on taking
        over it resumes the leader's last learned record rather than what it learned from
        that share, and its down windows start at the current counts (one that received
        every signal has learned and decided as the leader did: it goes on as it is)."""
        if self.backend is not None and self.backend.learned is not None:
            await self._resume_learned(self.backend.learned, taking_over=True)
        self.reactor.take_over_from_a_share()

    async def _keep_learned(self, store: kube_configmap.ConfigMapStore) -> None:
        """The leader writes the learned state every `write_seconds` when it changed (and
        every `learned.REFRESH_S` regardless, so its records stay young)."""
        while True:
            await asyncio.sleep(self.settings.kube.learned_state.write_seconds)
            await self._write_learned(store)

    async def _write_learned(self, store: kube_configmap.ConfigMapStore, *,
                             force: bool = False) -> None:
        if not self.leader.is_leader:
            return
        policies = {item.policy.key: item.policy
                    for item in self.watcher.current.policies.values()}
        learned = {key: values for key, values in self.reactor.learned().items()
                   if key in policies}
        resume = self.reactor.resume
        pending = dict(resume.records) if resume is not None else {}
        now = self.wall_clock()
        content = (learned, pending)
        if (not force and content == self._learned_written
                and now - self._learned_written_at < service_learned.REFRESH_S):
            return
        data, omitted = service_learned.payload(learned, policies, at=now, pending=pending)
        try:
            await store.write(data)
        except Exception as error:  # counted and logged; the next period tries again
            self.state.learned_writes[service_learned.FAILED] += 1
            log.warning("learned state: cannot write ConfigMap %s/%s: %s%s", store.namespace,
                        store.name, error, _LEARNED_GRANT if _forbidden(error) else "")
            return
        self.state.learned_writes[service_learned.WRITTEN] += 1
        if omitted:
            self.state.learned_records[service_learned.OMITTED] += omitted
            log.warning("learned state: %d models left out of ConfigMap %s/%s (over %d "
                        "bytes)", omitted, store.namespace, store.name,
                        service_learned.MAX_DATA_BYTES)
        self._learned_written, self._learned_written_at = content, now

    async def _expire(self) -> None:
        """Drop signal values past the store's TTL, at the backstop tick's pace."""
        while True:
            await asyncio.sleep(self.settings.engine.backstop_tick_seconds)
            self.store.expire(self.wall_clock())

    # -- stop ---------------------------------------------------------------------------

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.state.set_draining()
        stop = self.supervisor.stop
        sources = getattr(self, "sources", ())
        for name in (*(_task_name(each) for each in sources), "policy-watcher",
                     "policy-status", "reactor-backstop", "store-expiry"):
            await stop(name)
        if hasattr(self, "reactor"):
            await self.reactor.drain(timeout_s=self.drain_timeout_s)
        await stop("learned-state")
        if self._takeover is not None:
            self._takeover.cancel()
            await asyncio.gather(self._takeover, return_exceptions=True)
        if self.backend is not None and self.backend.learned is not None and hasattr(
                self, "watcher"):
            # The last minute's learning, while still leader (bounded: a dead API server
            # must not hold the shutdown).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._write_learned(self.backend.learned, force=True),
                                       timeout=self.settings.kube.request_timeout_s)
        await stop("leader")
        if hasattr(self, "leader"):
            await self.leader.release()
        await self.supervisor.stop_all()
        for server in (self.http, self.push_server, self.metrics_api):
            if server is not None:
                await server.close()
        for each in sources:
            await each.close()
        if self.backend is not None and self.backend.close is not None:
            await self.backend.close()
        if self._audit is not None:
            self._audit.close()
        if self._cert_dir is not None:
            shutil.rmtree(self._cert_dir, ignore_errors=True)
        log.info("scaler stopped")

    async def run_until_signalled(self) -> int:
        """Start, run until SIGTERM/SIGINT (drain, exit 0) or a task fails (exit 1).

        A start that fails (no cluster credentials, a port in use) is logged with its
        cause and exits 1 after undoing what had started.
        """
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop_requested.set)
        try:
            try:
                await self.start()
            except Exception as error:
                log.error("scaler could not start: %s: %s", type(error).__name__, error,
                          exc_info=True)
                return 1
            tune_collector()
            waiters = [asyncio.create_task(stop_requested.wait(), name="wait-signal"),
                       asyncio.create_task(self.supervisor.failed.wait(), name="wait-failure")]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            await self.stop()
        if self.supervisor.failures:
            for failure in self.supervisor.failures:
                log.error("stopped because task %s failed: %s", failure.name, failure.error)
            return 1
        return 0


_LEARNED_GRANT = (" (grant configmaps get, create and update in that namespace: `scaler kube "
                  "rbac`; or set kube.learned_state.enabled false)")


def _forbidden(error: Exception) -> bool:
    return isinstance(error, kube_client.KubeError) and error.status == 403


def _task_name(each: source.SignalSource) -> str:
    return f"source:{each.name}"


def _dropped(stats: samples.SourceStats) -> service_state.DropCounter:
    return lambda: dict(stats.dropped)


def _health(stats: samples.SourceStats) -> service_state.HealthReader:
    return lambda: service_state.SourceHealth(up=stats.up, connected=stats.connected,
                                              errors=dict(stats.errors))
