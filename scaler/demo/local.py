"""`scaler run --local`: the real service against the Kubernetes API emulator and a nats-server.

Everything runs on loopback in one process (the nats-server as a child process): the
emulator is seeded from the policies (namespaces, each target Deployment at its floor, a
GPU node pool per policy), its controller turns replicas into pods that become Ready after
a short cold start, and `scaler run`'s own `Service` runs against it through a kubeconfig,
with leader election on the emulator's Lease and the external metrics API authenticating
a printed bearer token through the emulator's TokenReview and SubjectAccessReview.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TextIO

import yaml
from nats.aio.client import Client

from scaler import data
from scaler import emulator as kube_emulator
from scaler.actuators import client as kube
from scaler.actuators import nodepool
from scaler.actuators import settings as kube_settings
from scaler.core import settings as core_settings
from scaler.core import vocabulary
from scaler.demo import nats_server
from scaler.emulator import env as emulator_env
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.service import logs, metrics_api, runner
from scaler.service import settings as service_settings
from scaler.signals import messages, nats_core

log = logging.getLogger(__name__)

DEFAULT_POLICIES = data.path("policies")
# 20 s from a pod's creation to Ready: long enough to see replicas "starting" in `scaler
# explain` (counted as capacity that arrives, not as missing), short enough to watch.
# A real 8B replica takes about two minutes (DESIGN 1).
DEFAULT_COLD_START_S = 20.0
# How a cold start splits into its steps: the nodes are up, so scheduling is immediate;
# image pull + model load take 4/5 and readiness 1/5, as in the 8B example (45 + 30 s of
# pull and load, 15 s of readiness: 83 % / 17 %).
START_SHARE = 0.8
# Nodes of the emulator's pools are plain objects: these are what a GPU server reports
# next to its GPUs, so `kubectl describe node` looks like one.
NODE_CPU = "96"
NODE_MEMORY = "1Ti"
# Who the printed token belongs to, as a TokenReview answers it.
LOCAL_USER = "scaler-local"
LOCAL_GROUPS = ("system:authenticated",)
CONTEXT = "scaler-local"
# --load: each model's demand follows a wave of this period, from its floor up to this
# many replicas above it and back, reported once a second as a replica would.
LOAD_PERIOD_S = 120.0
LOAD_PEAK_EXTRA_REPLICAS = 4
LOAD_INTERVAL_S = 1.0
LOAD_SOURCE = "scaler-local-load"


class LocalError(Exception):
    """Bad input for the local mode (policies, settings): the message says what; exit 2."""


@dataclass(frozen=True, slots=True)
class LocalOptions:
    """What `scaler run --local` was asked: policies, settings file, cold start, --load."""

    policies: tuple[Path, ...] = (DEFAULT_POLICIES,)
    settings_file: Path | None = None
    cold_start_s: float = DEFAULT_COLD_START_S
    load: bool = False
    dry_run: bool = False


# -- what the emulator is seeded with (pure) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class TargetSeed:
    """A policy's target Deployment as created: its namespace, name, replicas and GPUs."""

    namespace: str
    name: str
    replicas: int
    gpus_per_replica: int
    resource_name: str


@dataclass(frozen=True, slots=True)
class PoolSeed:
    """One GPU node pool: `nodes` Ready nodes with `gpus_per_node` of each resource name."""

    name: str
    nodes: int
    gpus_per_node: int
    resource_names: tuple[str, ...]
    labels: Mapping[str, str]

    def node_names(self) -> list[str]:
        return [f"{self.name}-{index}" for index in range(self.nodes)]


@dataclass(frozen=True, slots=True)
class Seed:
    """Everything the emulator starts with; `skipped` names targets it cannot serve."""

    namespaces: tuple[str, ...]
    targets: tuple[TargetSeed, ...]
    pools: tuple[PoolSeed, ...]
    skipped: tuple[str, ...] = ()


def initial_replicas(policy: policy_model.ScalePolicy, *, now: float) -> int:
    """What the target starts at: its floor in force now (min, or a larger warm floor),
    within max. The 8B example at 10:00 on a Monday in Berlin: max(1, 4) = 4."""
    spec = policy.spec
    return min(spec.replicas.max, max(spec.replicas.min, spec.warm_floor.at(now)))


def nodes_for(policy: policy_model.ScalePolicy) -> int:
    """Nodes that hold the policy's max replicas (whole replicas per node), within the
    pool's maxNodes: max 16 replicas of 8 GPUs on 8-GPU nodes -> 16 nodes; max 32 of 1
    GPU -> 4. The emulator has no node autoscaler, so a pool starts at the size it needs."""
    spec = policy.spec
    pool = spec.node_pool
    assert pool is not None
    per_node = max(1, pool.gpus_per_node // spec.resources.gpus_per_replica)
    return max(1, math.ceil(spec.replicas.max / per_node))


def plan_seed(policies: Sequence[policy_model.ScalePolicy], *, now: float,
              lease_namespace: str) -> Seed:
    """Namespaces, target Deployments and node pools for `policies` (a pure function).

    Models naming the same pool share its nodes (as they are planned together): the pool
    gets the sum of what each needs, within the smallest maxNodes among them.
    """
    namespaces = dict.fromkeys([lease_namespace])
    targets: list[TargetSeed] = []
    skipped: list[str] = []
    pools: dict[str, list[policy_model.ScalePolicy]] = {}
    for policy in policies:
        spec = policy.spec
        namespaces[policy.metadata.namespace] = None
        if (spec.target.api_version, spec.target.kind) != ("apps/v1", "Deployment"):
            skipped.append(f"{policy.key}: target {spec.target.kind} "
                           f"{spec.target.api_version} is not seeded (Deployments only)")
        else:
            targets.append(TargetSeed(
                namespace=policy.metadata.namespace, name=spec.target.name,
                replicas=initial_replicas(policy, now=now),
                gpus_per_replica=spec.resources.gpus_per_replica,
                resource_name=spec.resources.resource_name))
        if spec.node_pool is not None:
            pools.setdefault(spec.node_pool.name, []).append(policy)
    seeds = []
    for name, members in pools.items():
        first = members[0].spec.node_pool
        assert first is not None
        caps = [p.spec.node_pool.max_nodes for p in members
                if p.spec.node_pool is not None and p.spec.node_pool.max_nodes is not None]
        nodes = sum(nodes_for(p) for p in members)
        labels = {nodepool.POOL_LABEL: name}
        for member in members:
            if member.spec.node_pool is not None:
                labels.update(member.spec.node_pool.node_selector)
        seeds.append(PoolSeed(
            name=name, nodes=min([nodes, *caps]), gpus_per_node=first.gpus_per_node,
            resource_names=tuple(dict.fromkeys(p.spec.resources.resource_name
                                               for p in members)),
            labels=labels))
    return Seed(namespaces=tuple(namespaces), targets=tuple(targets), pools=tuple(seeds),
                skipped=tuple(skipped))


def node_manifest(pool: PoolSeed, name: str) -> kube.Obj:
    """A Ready GPU node of `pool`, as a kubelet registers one (status included)."""
    resources = {resource: str(pool.gpus_per_node) for resource in pool.resource_names}
    resources.update({"cpu": NODE_CPU, "memory": NODE_MEMORY})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
                     "labels": {**pool.labels, "kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources,
                   "conditions": [{"type": "Ready", "status": "True",
                                   "reason": "KubeletReady"}]},
    }


def kubeconfig_document(server: str) -> kube.Obj:
    """A kubeconfig whose current context is the emulator at `server` (no credentials:
    the emulator does not authenticate its clients)."""
    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": CONTEXT, "cluster": {"server": server}}],
        "users": [{"name": CONTEXT, "user": {}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT}}],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, *, server: str) -> Path:
    path.write_text(yaml.safe_dump(kubeconfig_document(server), sort_keys=False))
    path.chmod(0o600)  # kubectl warns about a kubeconfig others can read
    return path


def local_settings(base: service_settings.Settings, *, kubeconfig: Path, nats_url: str,
                   policies: Sequence[Path], dry_run: bool) -> service_settings.Settings:
    """`base` with what the local mode owns replaced: the cluster (the kubeconfig), NATS
    (the embedded server), the policies, loopback listeners on free ports, a text log."""
    return base.model_copy(update={
        "kube": base.kube.model_copy(update={
            "host": None, "kubeconfig": str(kubeconfig), "context": None,
            "dry_run": base.kube.dry_run or dry_run}),
        "nats": base.nats.model_copy(update={"servers": (nats_url,)}),
        "http": base.http.model_copy(update={
            "host": "127.0.0.1", "port": 0,
            "push_port": None if base.http.push_port is None else 0}),
        "metrics_api": base.metrics_api.model_copy(update={"host": "127.0.0.1", "port": 0}),
        "policies": base.policies.model_copy(update={"paths": list(policies)}),
        "log": base.log.model_copy(update={"format": "text"}),
    })


# -- --load: a synthetic signal stream (pure part) ----------------------------------------


def wave_replicas(*, floor: int, ceiling: int, elapsed_s: float) -> float:
    """Replicas' worth of demand at `elapsed_s`: from `floor` up to `floor` + 4 (within
    `ceiling`) and back once per LOAD_PERIOD_S, as sin^2. Floor 1: 1 at 0 s, 3 at 30 s,
    5 at 60 s, 3 at 90 s; scale-down then waits out each policy's down window."""
    extra = max(0, min(LOAD_PEAK_EXTRA_REPLICAS, ceiling - floor))
    return floor + extra * math.sin(math.pi * elapsed_s / LOAD_PERIOD_S) ** 2


def load_values(policy: policy_model.ScalePolicy, replicas: float
                ) -> dict[vocabulary.Signal, float]:
    """The message values that ask for `replicas` under the policy's signals: in-flight
    requests at its concurrency target, else tokens/s at its utilisation target; {} when
    it sizes by neither (its latency guard alone cannot be fed a number honestly)."""
    signals = policy.spec.signals
    if signals.concurrency is not None:
        return {vocabulary.Signal.IN_FLIGHT:
                round(replicas * signals.concurrency.target_per_replica, 3)}
    if signals.tokens_per_second is not None:
        tokens = signals.tokens_per_second
        return {vocabulary.Signal.TOKENS_PER_SECOND:
                round(replicas * tokens.capacity_per_replica * tokens.target_utilization, 3)}
    return {}


@dataclass(frozen=True, slots=True)
class LoadStream:
    """One model --load reports for: the subject the service listens on, and its policy."""

    subject: str
    policy: policy_model.ScalePolicy


def load_streams(policies: Sequence[policy_model.ScalePolicy], *, prefix: str
                 ) -> list[LoadStream]:
    """The models --load can feed: a NATS source and a concurrency or tokens/s signal."""
    by_key = {policy.key: policy for policy in policies}
    routes = nats_core.config_from_policies(policies, prefix=prefix).routes
    return [LoadStream(subject, by_key[key]) for subject, key in routes.items()
            if load_values(by_key[key], 1.0)]


# -- the run ------------------------------------------------------------------------------


@dataclass(slots=True)
class Local:
    """The running local mode: the emulator, its seed and token, and the service."""

    options: LocalOptions
    policies: Sequence[policy_model.ScalePolicy]
    base: service_settings.Settings
    nats_url: str
    state_dir: Path
    out: TextIO
    emulator: kube_emulator.KubeEmulator = field(init=False)
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        this = asyncio.current_task()
        assert this is not None
        for signum in (signal.SIGTERM, signal.SIGINT):  # until the service takes them over
            loop.add_signal_handler(signum, this.cancel)
        self.emulator = kube_emulator.KubeEmulator(
            clock=time.time, options=kube_emulator.EmulatorOptions(status_writer=True))
        try:
            await self.emulator.start()
            kubeconfig = write_kubeconfig(self.state_dir / "kubeconfig",
                                          server=self.emulator.url)
            settings = local_settings(
                self.base, kubeconfig=kubeconfig, nats_url=self.nats_url,
                policies=self.options.policies, dry_run=self.options.dry_run)
            seed = plan_seed(self.policies, now=time.time(),
                             lease_namespace=settings.kube.lease.namespace)
            await self._seed(seed, settings=kube_settings.KubeSettings(kubeconfig=str(kubeconfig)))
            self._grant()
            start = self.options.cold_start_s
            controller = kube_emulator.EmulatorController(
                self.emulator, kube_emulator.ControllerSettings(
                    start_delay_s=start * START_SHARE, ready_delay_s=start * (1 - START_SHARE)))
            service = runner.Service(settings, drain_timeout_s=5.0)
            # Supervised with the service's own tasks: a controller that dies stops the
            # service (exit 1, logged) instead of leaving pods that never turn Ready.
            service.supervisor.start("emulator-controller", controller.run())
            service.supervisor.start("local-banner", self._announce(
                service, seed=seed, settings=settings, kubeconfig=kubeconfig), essential=False)
            code = await service.run_until_signalled()
            for signum in (signal.SIGTERM, signal.SIGINT):  # stopping already: ignore more
                loop.add_signal_handler(signum, lambda: None)
            return code
        except asyncio.CancelledError:
            return 0  # stopped while setting up
        finally:
            await self.emulator.stop()

    async def _seed(self, seed: Seed, *, settings: kube_settings.KubeSettings) -> None:
        """Create the seed through the written kubeconfig with the project's client, as
        `kubectl apply` would: namespaces first (creating in a missing one is a 404)."""
        api_client = await kube.make_api_client(settings)
        api = kube.KubeApi(api_client, timeout_s=settings.request_timeout_s)
        try:
            for namespace in seed.namespaces:
                try:
                    await api.request("POST", "/api/v1/namespaces",
                                      body={"metadata": {"name": namespace}})
                except kube.KubeError as error:
                    if error.status != 409:  # "default" exists on every API server
                        raise
            for target in seed.targets:
                await emulator_env.KubeTestEnv(
                    api=api, namespace=target.namespace, settings=settings,
                ).create_deployment(target.name, replicas=target.replicas,
                                    gpus=target.gpus_per_replica,
                                    resource_name=target.resource_name)
            for pool in seed.pools:
                for name in pool.node_names():
                    node = node_manifest(pool, name)
                    await api.request("POST", "/api/v1/nodes", body=node)
                    # A create may drop status (the subresource's to write), as a
                    # kubelet's status update then sets it.
                    await api.merge_patch(f"/api/v1/nodes/{name}/status",
                                          {"status": node["status"]})
        finally:
            await api_client.close()

    def _grant(self) -> None:
        """The printed token reads the external metrics API, and nothing else."""
        reviews = self.emulator.reviews
        reviews.tokens[self.token] = {"username": LOCAL_USER, "groups": list(LOCAL_GROUPS)}
        reviews.grants.extend([
            kube_emulator.Grant(subject=LOCAL_USER, verbs=("get", "list", "watch"),
                                api_group=metrics_api.GROUP),
            kube_emulator.Grant(subject=LOCAL_USER, verbs=("get",),
                                paths=("/apis", f"{metrics_api.BASE}*")),
        ])

    async def _announce(self, service: runner.Service, *, seed: Seed,
                        settings: service_settings.Settings, kubeconfig: Path) -> None:
        """Print where everything is once the service is ready and subscribed, then run
        --load if asked."""
        while not service.state.ready:  # policies loaded, leadership known
            await asyncio.sleep(0.05)
        await service.wait_sources_ready()
        streams = load_streams(self.policies, prefix=settings.nats.subject_prefix)
        print(banner(self, service=service, seed=seed, kubeconfig=kubeconfig,
                     example=streams[0] if streams else None), file=self.out, flush=True)
        if self.options.load:
            await publish_load(self.nats_url, streams)


def signal_example(stream: LoadStream, *, nats_url: str) -> str:
    """A `nats pub` line asking for two replicas more than the model starts with, in its
    policy's units; the shell fills in `ts` (a message older than staleAfterSeconds, or
    more than 5 s ahead, is dropped)."""
    policy = stream.policy
    replicas = initial_replicas(policy, now=time.time()) + 2
    body = messages.encode(model=policy.metadata.name, namespace=policy.metadata.namespace,
                           ts=0, values=load_values(policy, replicas)).decode()
    body = body.replace('"ts":0', '"ts":\'$(date +%s)\'')
    return f"nats pub -s {nats_url} {stream.subject} '{body}'"


def banner(local: Local, *, service: runner.Service, seed: Seed, kubeconfig: Path,
           example: LoadStream | None) -> str:
    """The start-up text: one `  label  value` line per thing a person may use; the
    commands name `example`'s model."""
    http = service.http.url if service.http else ""
    nodes = sum(pool.nodes for pool in seed.pools)
    lines = [
        "scaler run --local: the real service against the Kubernetes API emulator "
        "(no cluster needed)",
        f"  kube-api     {local.emulator.url} (emulator: {len(seed.targets)} Deployments, "
        f"{nodes} GPU nodes in {len(seed.pools)} pools; pods Ready "
        f"{local.options.cold_start_s:g} s after creation)",
        f"  kubeconfig   {kubeconfig}",
        f"  nats         {local.nats_url} (embedded, JetStream on)",
        f"  http         {http} (/metrics, /healthz, /readyz, /v1/models)",
    ]
    if service.metrics_api is not None:
        lines += [f"  metrics-api  {service.metrics_api.url}{metrics_api.BASE} "
                  "(self-signed TLS: curl -k)",
                  f"  token        {local.token}"]
    if example is not None:
        policy = example.policy
        namespace, name = policy.metadata.namespace, policy.metadata.name
        lines.append(f"  explain      scaler explain {policy.key} --url {http}")
        if service.metrics_api is not None:
            lines.append(
                f"  curl         curl -k -H 'Authorization: Bearer {local.token}' "
                f"'{service.metrics_api.url}{metrics_api.BASE}/namespaces/{namespace}/"
                f"{metrics_api.DESIRED_REPLICAS}?labelSelector=model%3D{name}'")
        lines.append(f"  signal       {signal_example(example, nats_url=local.nats_url)}")
    if local.options.load:
        lines.append(f"  load         a synthetic wave for every model, every "
                     f"{LOAD_INTERVAL_S:g} s (period {LOAD_PERIOD_S:g} s)")
    lines.extend(f"  skipped      {why}" for why in seed.skipped)
    lines.append("Ctrl-C (or SIGTERM) stops everything.")
    return "\n".join(lines)


async def publish_load(nats_url: str, streams: Sequence[LoadStream]) -> None:
    """Publish each stream's wave once a second until cancelled."""
    client = Client()
    await client.connect(servers=[nats_url], connect_timeout=5, max_reconnect_attempts=-1,
                         reconnect_time_wait=1)
    started = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - started
            for stream in streams:
                spec = stream.policy.spec
                floor = initial_replicas(stream.policy, now=time.time())
                values = load_values(stream.policy, wave_replicas(
                    floor=floor, ceiling=spec.replicas.max, elapsed_s=elapsed))
                await client.publish(stream.subject, messages.encode(
                    model=stream.policy.metadata.name,
                    namespace=stream.policy.metadata.namespace, source=LOAD_SOURCE,
                    ts=time.time(), values=values))
            await asyncio.sleep(LOAD_INTERVAL_S)
    finally:
        await client.close()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_cleaned_up() -> Iterator[None]:
    """SIGTERM is taken as Ctrl-C while no event loop handles it (nats-server starting);
    the previous handlers are restored after the block."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _ignore_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


def load_inputs(options: LocalOptions
                ) -> tuple[service_settings.Settings, list[policy_model.ScalePolicy]]:
    """The settings file (the environment is ignored: a real deployment's SCALER_* must
    not point the local mode elsewhere) and the policies; LocalError names what is wrong."""
    try:
        base = service_settings.load_settings(options.settings_file, environ={})
    except core_settings.SettingsError as error:
        raise LocalError("; ".join(f"invalid settings: {p}" for p in error.problems)) from None
    result = loader.load_paths(list(options.policies))
    if result.errors:
        raise LocalError("; ".join(str(e) for e in result.errors))
    if not result.policies:
        raise LocalError(f"no policies in {', '.join(map(str, options.policies))}")
    return base, list(result.policies)


def main(options: LocalOptions, *, out: TextIO | None = None) -> int:
    """Run until Ctrl-C or SIGTERM (exit 0), a failure (1) or bad input (2). The
    nats-server is stopped and the state dir (kubeconfig) removed in every case."""
    stream = out or sys.stdout
    try:
        base, policies = load_inputs(options)
    except LocalError as error:
        print(f"scaler run --local: {error}", file=sys.stderr)
        return 2
    logs.configure(level=base.log.level, fmt="text")
    state_dir = Path(tempfile.mkdtemp(prefix="scaler-local-"))
    server = nats_server.NatsServer(jetstream=True)
    code = 0
    with _signals_cleaned_up():
        try:
            server.start()
            local = Local(options=options, policies=policies, base=base,
                          nats_url=server.url, state_dir=state_dir, out=stream)
            code = asyncio.run(local.run())
        except KeyboardInterrupt:
            code = 0
        except Exception as error:  # nats-server or the emulator could not start
            log.debug("local mode failed", exc_info=True)
            print(f"scaler run --local: failed: {type(error).__name__}: {error}",
                  file=sys.stderr)
            code = 1
        finally:
            _ignore_signals()  # a second Ctrl-C must not leave the nats-server behind
            server.close()
            shutil.rmtree(state_dir, ignore_errors=True)
    return code
