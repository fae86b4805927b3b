"""Fleet replay (DESIGN 4.6): several models on shared GPU pools and budgets, one clock."""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
import pydantic
import yaml
from pydantic import Field

from scaler.core import errors, vocabulary
from scaler.engine import cost as engine_cost
from scaler.engine import decide as engine_decide
from scaler.engine import fleet as engine_fleet
from scaler.engine import spare as engine_spare
from scaler.engine import types as engine_types
from scaler.engine import variants as engine_variants
from scaler.policy import fleet as policy_fleet
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import feed as sim_feed
from scaler.sim import profiles, run, strategies, traces
from scaler.sim.strategies import scaler as scaler_strategy

# Strategies a fleet replays: the engine and the baselines, each model its own. The
# oracle and static-peak plan one model alone on its own cluster: on a shared pool their
# search (many replays of one trace) would have to be repeated for every other model's
# schedule, so they are left out of fleet mode.
FLEET_STRATEGIES: tuple[str, ...] = ("scaler", "hpa", "keda", "kpa")
# The fleet is checked and sampled once a second: the engine's evaluation period in
# the simulator (`ScalerStrategy.period_s`), so a "cycle" is one arbitration.
CYCLE_S = 1.0
# The pool series of the report: GPUs held every 10 s, as the single-model series.
SERIES_S = 10.0
UNLABELLED = "(none)"
"""The by-tenant / by-cost-centre key of models without that label."""
FUNCTIONS_FORMAT = "azure-functions"
TRACE_FORMATS: tuple[str, ...] = (*traces.FORMATS, FUNCTIONS_FORMAT)

IntArray = npt.NDArray[np.int64]


class FleetError(ValueError):
    """A bad FLEET.yaml or a file it names: says which file and which field."""


# ----- the fleet file ----------------------------------------------------------------------


class TraceSource(policy_model._Model):
    """Where one model's requests come from: a trace file, or part of a multi-client one."""

    path: str = Field(description="Trace file or ServeGen folder, relative to the fleet file.")
    format: Literal["auto", "azure", "mooncake", "servegen", "csv", "azure-functions"] = Field(
        default="auto", description="As --trace-format, plus azure-functions: the Azure "
        "Functions 2019 invocations CSV (HashFunction, HashApp, HashOwner, minute_1..N).")
    rate_scale: float = Field(default=1.0, gt=0, description="As --rate-scale.")
    start: float | None = Field(default=None, ge=0, description="As --start (seconds).")
    duration: float | None = Field(default=None, gt=0, description="As --duration (seconds).")
    clients: tuple[str, ...] = Field(
        default=(), description="ServeGen: the clients of the folder this model serves "
        "(chunk-N, the file chunk-N-trace.csv). Empty: every client.")
    functions: tuple[str, ...] = Field(
        default=(), description="azure-functions: the HashFunction values (or unique "
        "prefixes of at least 8 characters) whose invocations are this model's requests.")
    lengths: str | None = Field(
        default=None, description="ShareGPT stats CSV for token lengths (ServeGen and "
        "azure-functions). None: beside the trace folder, else the bundled sample.")


class FleetModel(policy_model._Model):
    policy: str = Field(description="ScalePolicy file, relative to the fleet file.")
    name: str | None = Field(default=None, description="The policy's metadata.name when "
                             "the file holds several. None: its first policy.")
    trace: TraceSource = Field(description="The model's requests.")
    termination_grace_period_seconds: int = Field(
        default=int(sim_cluster.TERMINATION_GRACE_S), ge=0, le=sim_cluster.MAX_GRACE_S,
        strict=True, description="The model's Deployment's pod template "
        "terminationGracePeriodSeconds (every variant's, for a model with variants): how "
        "long a replica removed by a scale-down drains what it holds before the rest is "
        "cut. Whole seconds, 0 to 86,400; default 30, Kubernetes' own. 0: cut at SIGTERM "
        "(vLLM's default --shutdown-timeout 0).")
    dispatch: sim_cluster.Dispatch = Field(
        default="push", description="How requests reach the model's replicas (every "
        "variant's, each its own queue): push, a Service routing each arrival to the "
        "least-loaded replica's own queue (an online model behind vLLM); queue, a work "
        "queue the replicas pull from when they have room (batch fed from a JetStream "
        "work-queue stream), so a removed replica holds only the answers it started.")


class FleetReservation(policy_model._Model):
    """Capacity held out of a pool for the replay (training), beside the pool's own."""

    pool: str = Field(description="The GpuPool it is held on.")
    name: str = Field(description="What it is held for, e.g. training.")
    gpus: int = Field(ge=1, description="GPUs held: never given to a scaled model.")


class FleetFile(policy_model._Model):
    """FLEET.yaml: the models with their policy and trace, and the pool and budget files."""

    pools: tuple[str, ...] = Field(min_length=1, description="Files or folders with the "
                                   "GpuPool documents.")
    budgets: tuple[str, ...] = Field(default=(), description="Files or folders with the "
                                     "GpuBudget documents.")
    reservations: tuple[FleetReservation, ...] = Field(default=())
    models: tuple[FleetModel, ...] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Part:
    """One variant of a model with variants (spec.variants): its own replicas, profile and
    pool, priced at its own GPU-hour. `key` is its Ask's, 'ns/model#variant'."""

    name: str
    key: str
    pool: str
    profile: profiles.ReplicaProfile
    gpus_per_replica: int
    capacity: float
    gpu_hourly: float


@dataclass(frozen=True, slots=True)
class Member:
    """One model of the fleet, ready to replay. A model with variants has `parts` (its
    pool and profile are then its first variant's)."""

    policy: policy_model.ScalePolicy
    profile: profiles.ReplicaProfile
    trace: traces.Trace
    pool: str
    metric: str
    threshold_s: float
    feasible: frozenset[int]
    parts: tuple[Part, ...] = ()
    grace_s: float = sim_cluster.TERMINATION_GRACE_S
    dispatch: sim_cluster.Dispatch = "push"

    @property
    def key(self) -> str:
        return self.policy.key

    @property
    def cluster_keys(self) -> tuple[str, ...]:
        """Its simulated clusters: one per variant, else one under its own key."""
        return tuple(p.key for p in self.parts) if self.parts else (self.key,)

    def pool_of(self, cluster_key: str) -> str:
        return next((p.pool for p in self.parts if p.key == cluster_key), self.pool)

    @property
    def tier(self) -> vocabulary.Tier:
        return self.policy.spec.tier

    @property
    def gpus_per_replica(self) -> int:
        return self.policy.spec.resources.gpus_per_replica


@dataclass(frozen=True, slots=True)
class Fleet:
    """A loaded FLEET.yaml: its models, pools (with the file's reservations added) and
    budgets."""

    path: str
    members: tuple[Member, ...]
    pools: Mapping[str, policy_fleet.GpuPool]
    budgets: Mapping[str, policy_fleet.GpuBudget]

    def members_of(self, pool: str) -> list[Member]:
        return [m for m in self.members if pool in {m.pool_of(k) for k in m.cluster_keys}]

    def clusters_on(self, pool: str) -> list[tuple[Member, str]]:
        """Every (model, cluster key) whose replicas run on `pool`."""
        return [(m, k) for m in self.members for k in m.cluster_keys if m.pool_of(k) == pool]


def _at(where: str, field_name: str, *, message: str) -> FleetError:
    return FleetError(errors.located(where, field_name, message))


def _read_fleet_file(path: Path) -> FleetFile:
    where = str(path)
    try:
        document = yaml.load(path.read_text(), Loader=loader.StrictLoader)  # a SafeLoader
    except OSError as exc:
        raise _at(where, "", message=f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise _at(where, "", message=errors.yaml_problem(exc)) from None
    if not isinstance(document, dict):
        raise _at(where, "", message="expected a mapping with pools, budgets, reservations "
                  "and models")
    try:
        return FleetFile.model_validate(document)
    except pydantic.ValidationError as exc:
        problems = errors.field_problems(
            exc, unknown_field="unknown field (check the spelling; fields are camelCase)")
        raise FleetError("\n".join(errors.located(where, p.field, p.message)
                                   for p in problems)) from None


def _load_documents(where: str, *, field_name: str, paths: Sequence[Path]
                    ) -> loader.LoadResult:
    for path in paths:
        if not path.exists():
            raise _at(where, field_name, message=f"{path}: no such file or folder")
    result = loader.load_paths(paths)
    if result.errors:
        raise _at(where, field_name, message="invalid documents:\n" + "\n".join(
            f"  {error}" for error in result.errors))
    return result


def _policy_of(where: str, *, index: int, entry: FleetModel, base: Path
               ) -> policy_model.ScalePolicy:
    field_name = f"models[{index}].policy"
    policies = _load_documents(where, field_name=field_name, paths=[base / entry.policy]).policies
    if entry.name is not None:
        policies = [p for p in policies if p.name == entry.name]
    if not policies:
        named = f" named {entry.name!r}" if entry.name else ""
        raise _at(where, field_name, message=f"{base / entry.policy} has no ScalePolicy{named}")
    return policies[0]


def load_fleet(path: Path, *, seed: int = 0) -> Fleet:
    """Read and check FLEET.yaml and everything it names; FleetError says what is wrong.

    Paths are relative to the fleet file. Each model's GPU hour is priced at its pool's
    `gpuHourly` (one price per pool, so the fleet's costs add up).
    """
    spec = _read_fleet_file(path)
    where, base = str(path), path.parent
    pool_docs = _load_documents(where, field_name="pools", paths=[base / p for p in spec.pools])
    if not pool_docs.pools:
        raise _at(where, "pools", message="the files hold no GpuPool document")
    pools = {item.value.name: item.value for item in pool_docs.pools}
    budget_docs = _load_documents(where, field_name="budgets",
                                  paths=[base / p for p in spec.budgets])
    budgets = {item.value.name: item.value for item in budget_docs.budgets}
    for name, budget in sorted(budgets.items()):
        if budget.spec.pool is not None and budget.spec.pool not in pools:
            raise _at(where, "budgets",
                      message=f"GpuBudget {name}: spec.pool {budget.spec.pool!r} is not a "
                      f"pool of the fleet ({', '.join(sorted(pools))})")
    for index, held in enumerate(spec.reservations):
        pool = pools.get(held.pool)
        if pool is None:
            raise _at(where, f"reservations[{index}].pool",
                      message=f"{held.pool!r} is not a pool of the fleet "
                      f"({', '.join(sorted(pools))})")
        document = pool.model_dump(by_alias=True)
        document["spec"]["reservations"] = [*document["spec"]["reservations"],
                                            {"name": held.name, "gpus": held.gpus}]
        try:
            pools[held.pool] = policy_fleet.GpuPool.model_validate(document)
        except pydantic.ValidationError as exc:
            message = "; ".join(p.message for p in errors.field_problems(
                exc, unknown_field="unknown field"))
            raise _at(where, f"reservations[{index}]", message=message) from None
    members: list[Member] = []
    for index, entry in enumerate(spec.models):
        policy = _policy_of(where, index=index, entry=entry, base=base)
        parts = _parts_of(where, index=index, policy=policy, pools=pools)
        pool_name = (parts[0].pool if parts
                     else _pool_of(where, index=index, policy=policy, pools=pools))
        pool = pools[pool_name]
        policy = policy.model_copy(update={"spec": policy.spec.model_copy(update={
            "cost": policy_model.Cost(gpu_hourly=pool.spec.gpu_hourly)})})
        try:
            profile = (parts[0].profile if parts else
                       profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100"))
        except profiles.ProfileError as exc:
            raise _at(where, f"models[{index}].policy", message=str(exc)) from None
        trace = load_source(entry.trace, base=base, seed=seed + index,
                            where=f"{where}: models[{index}].trace")
        if trace.requests == 0:
            raise _at(where, f"models[{index}].trace",
                      message=f"no requests in {trace.path}'s slice")
        metric, threshold = run.slo_of(policy)
        # A window is feasible when it is on some variant's hardware: the best achievable.
        windows = set().union(*(
            run.feasible(trace, profile=each, metric=metric, threshold=threshold)
            for each in ([p.profile for p in parts] or [profile])))
        members.append(Member(policy=policy, profile=profile, trace=trace, pool=pool_name,
                              metric=metric, threshold_s=threshold,
                              feasible=frozenset(windows), parts=parts,
                              grace_s=float(entry.termination_grace_period_seconds),
                              dispatch=entry.dispatch))
    keys = [m.key for m in members]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise _at(where, "models", message=f"{', '.join(twice)} named more than once")
    return Fleet(path=str(path), members=tuple(members), pools=pools, budgets=budgets)


def _parts_of(where: str, *, index: int, policy: policy_model.ScalePolicy,
              pools: Mapping[str, policy_fleet.GpuPool]) -> tuple[Part, ...]:
    """A policy's variants as Parts, each checked against its GpuPool (the policy's own
    nodePool is not used: each variant names its pool)."""
    parts = []
    for number, variant in enumerate(policy.spec.variants):
        field_name = f"models[{index}].policy: spec.variants[{number}]"
        pool = pools.get(variant.node_pool)
        if pool is None:
            raise _at(where, field_name, message=f"variant {variant.name}: nodePool "
                      f"{variant.node_pool!r} is not a pool of the fleet "
                      f"({', '.join(sorted(pools))})")
        resources = variant.resources
        if (resources.gpus_per_replica > pool.spec.gpus_per_node
                or resources.resource_name != pool.spec.resource_name):
            raise _at(where, field_name, message=f"variant {variant.name}: "
                      f"{resources.gpus_per_replica} x {resources.resource_name} per replica "
                      f"does not fit pool {pool.name} ({pool.spec.gpus_per_node} x "
                      f"{pool.spec.resource_name} per node)")
        try:
            profile = profiles.load_profile(variant.profile or policy.spec.profile
                                            or "llama-3.1-8b-h100")
        except profiles.ProfileError as exc:
            raise _at(where, field_name, message=str(exc)) from None
        parts.append(Part(
            name=variant.name, key=engine_variants.variant_key(policy.key, variant.name),
            pool=pool.name, profile=profile, gpus_per_replica=resources.gpus_per_replica,
            capacity=variant.capacity,
            gpu_hourly=(variant.gpu_hourly if variant.gpu_hourly is not None
                        else pool.spec.gpu_hourly)))
    return tuple(parts)


def _pool_of(where: str, *, index: int, policy: policy_model.ScalePolicy,
             pools: Mapping[str, policy_fleet.GpuPool]) -> str:
    """The GpuPool the policy's nodePool names, checked against the policy's shape."""
    field_name = f"models[{index}].policy"
    node_pool = policy.spec.node_pool
    if node_pool is None or node_pool.name not in pools:
        named = "has no spec.nodePool" if node_pool is None else (
            f"spec.nodePool.name {node_pool.name!r} is not a pool of the fleet")
        raise _at(where, field_name,
                  message=f"policy {policy.key} {named} ({', '.join(sorted(pools))})")
    pool = pools[node_pool.name].spec
    resources = policy.spec.resources
    if resources.gpus_per_replica > pool.gpus_per_node:
        raise _at(where, field_name,
                  message=f"policy {policy.key}: spec.resources.gpusPerReplica "
                  f"({resources.gpus_per_replica}) does not fit on a node of pool "
                  f"{node_pool.name} ({pool.gpus_per_node} GPUs)")
    if resources.resource_name != pool.resource_name:
        raise _at(where, field_name,
                  message=f"policy {policy.key}: spec.resources.resourceName "
                  f"{resources.resource_name} is not pool {node_pool.name}'s "
                  f"{pool.resource_name}")
    return node_pool.name


def load_source(source: TraceSource, *, base: Path, seed: int, where: str) -> traces.Trace:
    """One model's trace: a file's slice, some clients of a ServeGen folder, or some
    functions of the Azure Functions 2019 invocations, rate-scaled."""
    path = base / source.path
    lengths: traces.LengthChoice = "auto" if source.lengths is None else base / source.lengths
    try:
        if source.format == FUNCTIONS_FORMAT:
            stats = None if source.lengths is None else base / source.lengths
            trace = load_functions(path, functions=source.functions, seed=seed, lengths=stats)
            trace = traces.cut(trace, start_s=source.start, duration_s=source.duration)
            return traces.scale_rate(trace, source.rate_scale, seed=seed)
        if source.clients:
            if source.format not in ("auto", "servegen") or not path.is_dir():
                raise FleetError(f"{where}.clients: needs a ServeGen folder (format servegen), "
                                 f"not {path}")
            return _servegen_clients(path, source=source, seed=seed, lengths=lengths,
                                     where=where)
        if source.functions:
            raise FleetError(f"{where}.functions: goes with format {FUNCTIONS_FORMAT}")
        fmt: traces.TraceFormat = source.format  # type: ignore[assignment]  # not functions
        start = source.start
        if start is None and (fmt == "servegen" or (fmt == "auto" and path.is_dir())):
            start = 0.0  # ServeGen's own clock (window 0), so every client shares it
        return traces.load_trace(path, fmt, rate_scale=source.rate_scale, seed=seed,
                                 lengths=lengths, start_s=start,
                                 max_duration_s=source.duration)
    except (traces.TraceError, ValueError) as exc:
        if isinstance(exc, FleetError):
            raise
        raise FleetError(f"{where}.path: {exc}") from None


def _servegen_clients(folder: Path, *, source: TraceSource, seed: int,
                      lengths: traces.LengthChoice, where: str) -> traces.Trace:
    """The named clients of a ServeGen folder as one trace, on the folder's clock."""
    parts: list[traces.Trace] = []
    for i, client in enumerate(source.clients):
        file = folder / f"{client}-trace.csv"
        if not file.is_file():
            known = ", ".join(p.name.removesuffix("-trace.csv")
                              for p in traces.servegen_files(folder)[:5])
            raise FleetError(f"{where}.clients[{i}]: {client!r} is not a client of {folder} "
                             f"(e.g. {known})")
        parts.append(traces.load_trace(
            # Each client its own draws (seeds 1000 apart per model: see load_fleet).
            file, "servegen", rate_scale=source.rate_scale, seed=seed * 1000 + i,
            lengths=lengths, start_s=source.start or 0.0, max_duration_s=source.duration))
    return merged(parts, path=f"{folder} ({', '.join(source.clients)})")


def merged(parts: Sequence[traces.Trace], *, path: str) -> traces.Trace:
    """Traces on one clock as one, sorted by arrival."""
    arrival = np.concatenate([p.arrival_s for p in parts])
    order = np.argsort(arrival, kind="stable")
    return traces.Trace(
        path, arrival[order], np.concatenate([p.input_tokens for p in parts])[order],
        np.concatenate([p.output_tokens for p in parts])[order],
        rate_scale=parts[0].rate_scale, start_s=parts[0].start_s,
        length_source=parts[0].length_source)


def load_functions(path: Path, *, functions: Sequence[str], seed: int,
                   lengths: Path | None) -> traces.Trace:
    """Invocations of some Azure Functions 2019 functions as one model's requests.

    The file counts invocations per minute (`minute_1` .. `minute_1440`); within a minute
    arrivals are drawn uniformly, which is a Poisson process given the count. Token
    lengths are drawn with replacement from ShareGPT stats (`lengths`, else beside the
    folder, else the bundled sample). Example: a function with 14 invocations in minute
    1 gets 14 requests at uniform times in [0, 60) s.
    """
    if not functions:
        raise FleetError(f"{path}: format {FUNCTIONS_FORMAT} needs functions "
                         "(HashFunction values) to read")
    wanted = list(functions)
    found: dict[str, IntArray] = {}
    for line, row in _function_rows(path):
        for pick in wanted:
            if len(pick) >= 8 and row[0].startswith(pick):
                if pick in found:
                    raise traces.TraceError(path, line=line, column="HashFunction",
                                            message=f"prefix {pick!r} matches several functions")
                found[pick] = _minute_counts(row[3:], path=path, line=line)
    missing = [pick for pick in wanted if pick not in found]
    if missing:
        raise traces.TraceError(path, line=0, column="HashFunction",
                                message=f"no function {', '.join(map(repr, missing))} "
                                "(give HashFunction values or prefixes of 8+ characters)")
    counts = np.sum(list(found.values()), axis=0)
    rng = np.random.default_rng(seed)
    arrival = np.sort(np.concatenate([
        rng.uniform(60.0 * minute, 60.0 * (minute + 1), int(n))
        for minute, n in enumerate(counts.tolist()) if n]))
    stats = lengths if lengths is not None else traces.default_lengths_path(path)
    if stats is None:
        raise traces.TraceError(path, line=0, column=None, message="no ShareGPT token "
                                "lengths beside the folder; set the trace's lengths")
    pool_in, pool_out = traces.load_lengths(stats)
    drawn = rng.integers(0, pool_in.size, arrival.size)
    return traces.Trace(f"{path} ({', '.join(functions)})", arrival, pool_in[drawn],
                        np.maximum(pool_out[drawn], 1),
                        length_source=f"token lengths: ShareGPT stats {stats}")


def _function_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        if header[:3] != ["HashFunction", "HashApp", "HashOwner"]:
            raise traces.TraceError(path, line=1, column=None, message="expected the header "
                                    "HashFunction,HashApp,HashOwner,minute_1,...")
        for record in reader:
            if record:
                yield reader.line_num, record


def _minute_counts(cells: Sequence[str], *, path: Path, line: int) -> IntArray:
    counts = np.zeros(len(cells), dtype=np.int64)
    for i, cell in enumerate(cells):
        try:
            counts[i] = int(cell)
        except ValueError:
            raise traces.TraceError(path, line=line, column=f"minute_{i + 1}",
                                    message=f"{cell!r} is not a whole number") from None
        if counts[i] < 0:
            raise traces.TraceError(path, line=line, column=f"minute_{i + 1}",
                                    message="is negative")
    return counts


# ----- the shared pool on the simulated cluster ---------------------------------------------


@dataclass(slots=True)
class PoolNodes:
    """The nodes of one GpuPool, shared by the simulated clusters of its models."""

    nodes: list[sim_cluster.Node] = field(default_factory=list)
    live: int = 0


class PooledCluster(sim_cluster.SimCluster):
    """One model's SimCluster whose pods land on its pool's shared nodes.

    Everything else (pods, requests, scoring) is the model's own. The node list and its
    live count are the pool's, so the cluster autoscaler's max-nodes check
    (`PoolConfig.max_nodes`, the GpuPool's maxNodes) holds across the pool's models: a
    pod that fits nowhere stays pending, as on a real pool at its size.
    """

    def __init__(self, *, shared: PoolNodes, **kwargs: Any) -> None:
        self._shared = shared
        # SimCluster's constructor zeroes its node count before it places the start
        # replicas: the pool's count (other models' nodes) is not to be zeroed then.
        self._constructing = True
        # When each pod was bound to a node (slot -> time): it holds GPUs from then.
        self._bound_at: dict[int, float] = {}
        super().__init__(**kwargs)

    @property
    def nodes(self) -> list[sim_cluster.Node]:
        return self._shared.nodes

    @nodes.setter
    def nodes(self, _: list[sim_cluster.Node]) -> None:
        """SimCluster starts with its own empty list; the pool's stays."""

    @property
    def live_node_count(self) -> int:
        return self._shared.live

    @live_node_count.setter
    def live_node_count(self, value: int) -> None:
        # SimCluster counts +1/-1 per node booted or removed, on the pool's count.
        if not self._constructing:
            self._shared.live = value

    def _bootstrap(self, replicas: int) -> None:
        """The initial replicas, ready at the start, on the pool's free GPUs first, booting
        ready nodes only for the rest (each model booting its own would leave unused ones)."""
        self._constructing = False
        t0 = self.t0
        for _ in range(replicas):
            pod = self._new_pod(now=t0)
            if not self._place(pod, now=t0):
                if self.pool.max_nodes is not None and self._shared.live >= self.pool.max_nodes:
                    continue  # the pool is full: this one stays pending
                self._add_node(ready_at=t0)
                self._place(pod, now=t0)
            pod.ready_at = t0
        self.spec_replicas = replicas
        self.max_spec = replicas
        self.advance(t0)

    def _place(self, pod: sim_cluster.Pod, *, now: float) -> bool:
        placed = super()._place(pod, now=now)
        if placed:
            self._bound_at[pod.slot] = now
        return placed

    def gpu_seconds(self, *, until: float) -> float:
        """Allocated GPU-seconds, each pod from when it was bound to a node (a booting one
        included, as SimCluster bills it) until gone or `until`. A pod pending because the
        pool is at its size holds no GPU: SimCluster, whose pool grows for its one model,
        bills from creation, which on a full shared pool would bill GPUs nobody has."""
        total = 0.0
        for pod in self.pods:
            bound = self._bound_at.get(pod.slot)
            if bound is None:
                continue
            end = pod.gone_at if pod.gone_at is not None else until
            total += max(0.0, min(end, until) - max(bound, 0.0)) * pod.gpus
        return total

    def held_gpus(self) -> tuple[int, int]:
        """(GPUs held by replicas bound to a node and not draining, GPUs of every bound pod
        of this model: draining replicas and placeholders included)."""
        serving = held = 0
        for slot in self.live_slots:
            pod = self.pods[slot]
            if pod.node is None or pod.phase == "gone":
                continue
            held += pod.gpus
            if not pod.placeholder and pod.phase != "draining":
                serving += pod.gpus
        return serving, held


class VariantCluster(PooledCluster):
    """One variant's replicas of a model with variants: it serves the requests the
    model's `Router` puts in its `inbox`, not the whole trace (every variant holds the
    trace's arrays; a request is answered by the one it was routed to)."""

    def __init__(self, **kwargs: Any) -> None:
        self.inbox: list[int] = []
        self.routed = 0
        super().__init__(**kwargs)

    @property
    def drained(self) -> bool:
        """Every request routed here has finished or was cut."""
        return self.completed + self.interrupted_count == self.routed

    def run_step(self, now: float) -> None:
        """As SimCluster's, with the routed requests as this step's arrivals."""
        routed, self.inbox = self.inbox, []
        for request in routed:
            self._route(request)
        self.routed += len(routed)
        self.next_arrival = int(np.searchsorted(self.arrival, now, side="right"))
        self._admit()
        generated, busy_ready = self._serve(now)
        self._record(arrivals=len(routed), generated=generated, busy_ready=busy_ready)


@dataclass(slots=True)
class Router:
    """A model's gateway in front of its variants, as an inference gateway scoring by
    queue: each arrival goes to the variant with the least load per unit of ready
    capacity, (queued + running + 1) / (ready replicas x capacity per replica); with no
    ready replica anywhere, to the variant with the most replicas asked (its pods start
    for it). Requests a variant's context limit rejects go to the others."""

    parts: tuple[VariantCluster, ...]
    capacities: tuple[float, ...]
    next_arrival: int = 0

    def route(self, now: float) -> None:
        """Route the arrivals up to `now`, and the requests held by a variant scaled to
        nothing (they would wait there for ever)."""
        held: list[int] = []
        for cluster in self.parts:
            if cluster.gateway and cluster.spec_replicas == 0 and not cluster.ready_slots:
                held.extend(cluster.gateway)
                cluster.routed -= len(cluster.gateway)
                cluster.gateway.clear()
        end = int(np.searchsorted(self.parts[0].arrival, now, side="right"))
        # A variant's load: its ready replicas' queued and running requests, plus its
        # shared queue with queue dispatch (with push dispatch the gateway holds requests
        # only while no replica is ready, when its load is not read).
        loads = [sum(c.load[s] for s in c.ready_slots) + len(c.gateway) for c in self.parts]
        ready = [len(c.ready_slots) for c in self.parts]
        fallback = max(range(len(self.parts)),
                       key=lambda i: (self.parts[i].spec_replicas * self.capacities[i], -i))
        for request in (*held, *range(self.next_arrival, end)):
            open_ = [i for i, c in enumerate(self.parts) if not c.rejected[request]]
            if not open_:
                continue  # beyond every variant's context: rejected (see `_merged`)
            served = [i for i in open_ if ready[i]]
            if served:
                best = min(served, key=lambda i: (
                    (loads[i] + 1) / (ready[i] * self.capacities[i]), i))
                loads[best] += 1
            else:
                best = fallback if fallback in open_ else open_[0]
            self.parts[best].inbox.append(request)
        self.next_arrival = max(self.next_arrival, end)


def _equivalent_state(parts: Sequence[VariantCluster], *, capacities: Sequence[float],
                      unit: float, start_epoch_s: float, now: float
                      ) -> engine_types.ClusterState:
    """A model's variants as `decide` reads replicas, capacity-equivalent
    (`engine.variants.equivalent_state`, as the service reads them)."""
    states = [sim_feed.cluster_state(c, start_epoch_s=start_epoch_s, now=now) for c in parts]
    return engine_variants.equivalent_state(
        states, weights=[capacity / unit for capacity in capacities])


def _busy_of(work: Mapping[str, engine_spare.PodWork], variant: str) -> int:
    """A variant's replicas reporting unfinished work: its sources are '<variant>/pod-N'
    (and its gateway's, counted as one, as `ScalerStrategy.cluster_state` counts it)."""
    prefix = f"{variant}/"
    return engine_spare.busy_replicas({source: each for source, each in work.items()
                                       if source.startswith(prefix)})


# ----- arbitration ---------------------------------------------------------------------------


@dataclass(slots=True)
class FleetScaler:
    """The `scaler` strategy of a fleet: each model decides with the real engine, then
    one fleet step over all models caps them, and each model's evaluation takes its cap
    as `ClusterState.budget_gpus` (the engine's EXTERNAL_BUDGET clamp), as the service
    wiring does. The model's own engine (signal feed and state) is `ScalerStrategy`'s."""

    fleet: Fleet
    engines: dict[str, scaler_strategy.ScalerStrategy]
    period_s: float = CYCLE_S
    pools: list[engine_fleet.FleetPool] = field(init=False)
    budgets: list[engine_fleet.BudgetRule] = field(init=False)
    # Per variant (part key): its replicas' reports, published into its model's feed
    # under sources '<variant>/pod-N', so the model's store sums every variant.
    part_feeds: dict[str, sim_feed.SignalFeed] = field(init=False)

    def __post_init__(self) -> None:
        self.pools = [engine_fleet.fleet_pool(pool)
                      for _, pool in sorted(self.fleet.pools.items())]
        self.budgets = [engine_fleet.budget_rule(budget)
                        for _, budget in sorted(self.fleet.budgets.items())]
        self.part_feeds = {}
        for member in self.fleet.members:
            own = self.engines[member.key].feed
            for part in member.parts:
                self.part_feeds[part.key] = sim_feed.SignalFeed(
                    model_key=member.key, start_epoch_s=own.start_epoch_s,
                    latency_metric=own.latency_metric, delay_s=own.delay_s,
                    interval_s=own.interval_s)

    def _variant_snapshot(self, member: Member, parts: Sequence[VariantCluster], *,
                          now: float) -> engine_types.SignalSnapshot:
        """What the model's store holds of every variant's reports (as `feed.advance`
        for one cluster)."""
        feed = self.engines[member.key].feed
        if now >= feed.next_publish - 1e-9:
            samples = [dataclasses.replace(sample, source=f"{part.name}/{sample.source}")
                       for part, cluster in zip(member.parts, parts, strict=True)
                       for sample in self.part_feeds[part.key].measure(cluster, now=now)]
            feed.pending.append((now + feed.delay_s, samples))
            feed.next_publish = now + feed.interval_s
        while feed.pending and feed.pending[0][0] <= now + 1e-9:
            feed.store.put(feed.pending.popleft()[1])
        return feed.snapshot(now=now, stale_after_s=member.policy.spec.stale_after_seconds)

    def _variant_model(self, member: Member, parts: Sequence[VariantCluster], *,
                       decision: engine_types.Decision, now: float
                       ) -> engine_variants.VariantModel:
        """The model as the fleet step mixes it; for a batch tier each variant keeps its
        replicas reporting unfinished work (`Option.keep`), as a model without variants
        keeps them through the engine's busy floor."""
        held = {p.name: (len(c.ready_slots), len(c.not_ready))
                for p, c in zip(member.parts, parts, strict=True)}
        policy = member.policy
        options = engine_variants.options_of(policy, pools=self.fleet.pools, held=held)
        if member.tier is vocabulary.Tier.BATCH:
            work = self.engines[member.key].work(now=now)
            options = tuple(dataclasses.replace(option, keep=_busy_of(work, option.name))
                            for option in options)
        return engine_variants.VariantModel(
            key=member.key, tier=member.tier, tenant=policy.tenant,
            cost_center=policy.cost_center,
            demand=engine_variants.demand_of(policy, decision),
            lookahead_s=engine_variants.lookahead_of(policy, decision), options=options)

    def decide(self, clusters: Mapping[str, PooledCluster], *, now: float) -> dict[str, int]:
        """Every model's replicas at `now`: its own decision uncapped (the ask), the
        fleet's grants over all asks, then, where the grant's cap binds, the decision again
        under it; that decision's engine state is the one kept (decide is pure: the first
        call changed nothing)."""
        asks: list[engine_fleet.Ask] = []
        drafts: dict[str, tuple[engine_types.SignalSnapshot, engine_types.ClusterState,
                                engine_types.Decision, engine_types.EngineState]] = {}
        members = [m for m in self.fleet.members
                   if all(k in clusters for k in m.cluster_keys)]
        mixed: list[engine_variants.VariantModel] = []
        out: dict[str, int] = {}
        for member in members:
            engine = self.engines[member.key]
            epoch = engine.start_epoch_s + now
            if member.parts:
                # A model with variants decides once on all of them (capacity-equivalent
                # replicas), then the fleet step mixes its demand over the variants.
                parts = [cast(VariantCluster, clusters[k]) for k in member.cluster_keys]
                decision, engine.state = engine_decide.decide(
                    member.policy, snapshot=self._variant_snapshot(member, parts, now=now),
                    cluster=_equivalent_state(
                        parts, capacities=[p.capacity for p in member.parts],
                        unit=engine_variants.unit_capacity(member.policy),
                        start_epoch_s=engine.start_epoch_s, now=now),
                    state=engine.state, now=epoch)
                mixed.append(self._variant_model(member, parts, decision=decision, now=now))
                continue
            cluster = clusters[member.key]
            snapshot = engine.snapshot(cluster, now=now)
            state = engine.cluster_state(cluster, now=now)
            decision, after = engine_decide.decide(member.policy, snapshot=snapshot,
                                                   cluster=state, state=engine.state, now=epoch)
            asks.append(engine_fleet.ask_of(member.policy, decision, now=epoch))
            drafts[member.key] = (snapshot, state, decision, after)
        grants, mixes = engine_variants.settle(self.pools, self.budgets, asks=asks,
                                               models=mixed)
        for member in members:
            for part in member.parts:
                out[part.key] = mixes[member.key].replicas[part.name]
        for member in members:
            if member.parts:
                continue
            engine = self.engines[member.key]
            snapshot, state, decision, after = drafts[member.key]
            grant = grants[member.key]
            if grant.cap_gpus is not None and grant.cap_gpus // member.gpus_per_replica < (
                    decision.desired):
                # The cap binds: decide again under it. (A cap at or above the decision
                # changes neither the count nor the state: the first call stands.)
                capped = dataclasses.replace(state, budget_gpus=grant.cap_gpus,
                                             budget_reason=grant.reason or None)
                decision, after = engine_decide.decide(
                    member.policy, snapshot=snapshot, cluster=capped, state=engine.state,
                    now=engine.start_epoch_s + now)
            engine.state = after
            out[member.key] = decision.desired
        for member in members:  # deletion costs before the scale-downs, as the service
            engine = self.engines[member.key]
            for part in member.parts:
                engine.annotate(clusters[part.key], desired=out[part.key], now=now,
                                prefix=f"{part.name}/")
            if not member.parts:
                engine.annotate(clusters[member.key], desired=out[member.key], now=now)
        return out


# ----- the replay ----------------------------------------------------------------------------


@dataclass(slots=True)
class Ledger:
    """Per cycle: GPUs held per pool by tier (for the report) and the limits exceeded."""

    t: list[float] = field(default_factory=list)
    by_tier: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    cycles_over: int = 0
    over: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetStrategyResult:
    """One strategy over the fleet: each model's run and the fleet's figures."""

    name: str
    models: dict[str, run.StrategyResult]
    fleet: dict[str, Any]
    pool_series: dict[str, dict[str, list[float]]]


@dataclass(frozen=True, slots=True)
class FleetResult:
    fleet: Fleet
    seed: int
    results: dict[str, FleetStrategyResult]

    def model_result(self, member: Member) -> run.SimulationResult:
        """One model's 4.4 result over every strategy (for its table and JSON)."""
        return run.SimulationResult(
            trace=member.trace, policy=member.policy, profile=member.profile,
            slo_metric=member.metric, slo_threshold_s=member.threshold_s,
            results={name: r.models[member.key] for name, r in self.results.items()},
            dispatch=member.dispatch)

    def to_json(self) -> dict[str, Any]:
        """Per model the 4.4 document; per strategy the `fleet` object (DESIGN 4.6)."""
        return {
            "fleet": self.fleet.path,
            "seed": self.seed,
            "pools": {name: {"gpus": pool.spec.total_gpus,
                             "reserved_gpus": pool.spec.reserved_gpus,
                             "gpus_per_node": pool.spec.gpus_per_node,
                             "gpu_hourly": pool.spec.gpu_hourly}
                      for name, pool in sorted(self.fleet.pools.items())},
            "models": {m.key: self.model_result(m).to_json() for m in self.fleet.members},
            "strategies": {name: {"fleet": r.fleet} for name, r in self.results.items()},
        }


def _pool_config(member: Member, pool: policy_fleet.GpuPool) -> sim_cluster.PoolConfig:
    return sim_cluster.PoolConfig(gpus_per_node=pool.spec.gpus_per_node,
                                  node_boot_s=member.profile.cold_start.node_boot_seconds,
                                  max_nodes=pool.spec.max_nodes)


def _start_replicas(member: Member, pool: sim_cluster.PoolConfig) -> int:
    """Each model's start: what its first minute needs at the rate estimate (the same for
    every strategy; the oracle's start search is a single-model replay)."""
    context = run.context_for(policy=member.policy, profile=member.profile,
                              trace=member.trace, pool=pool)
    return run.initial_replicas(member.policy, context.rate_need)


def _start_parts(member: Member, fleet: Fleet, *, strategy: str) -> dict[str, int]:
    """A model with variants starts with its first minute's need (in replicas of its
    first variant) as a demand, mixed cold over its variants for `scaler`; a baseline
    scales its first variant alone, as an HPA on one Deployment would."""
    first = member.parts[0]
    pool = _pool_config(member, fleet.pools[first.pool])
    need = _start_replicas(member, pool)
    if strategy != "scaler":
        return {p.key: need if p is first else 0 for p in member.parts}
    options = [engine_variants.Option(
        name=p.key, capacity=p.capacity, price=p.gpu_hourly * p.gpus_per_replica,
        room=fleet.pools[p.pool].spec.shareable_gpus // p.gpus_per_replica)
        for p in member.parts]
    chosen = engine_variants.mix(options, demand=need * first.capacity, lookahead_s=math.inf)
    return dict(chosen.replicas)


def replay(fleet: Fleet, *, strategy: str, dt: float = 0.1,
           progress: run.Progress | None = None, deletion_cost: bool = True
           ) -> FleetStrategyResult:
    """Every model of the fleet on its pool's shared nodes under one strategy, one clock.

    Each step: pods advance on every cluster; strategies decide when due (baselines each
    model alone every own period; `scaler` all models at once every second, then the
    fleet step); every cluster serves its step. Once a second the GPUs held are tallied
    per pool and tier and checked against every budget's ceiling and each pool's
    unreserved GPUs. A model whose trace has ended and drained gives its GPUs back.
    `deletion_cost=False`: `scaler` writes no pod-deletion-cost before its scale-downs
    (the service's kube.deletion_cost.enabled off).
    """
    if strategy not in FLEET_STRATEGIES:
        raise ValueError(f"fleet mode runs {', '.join(FLEET_STRATEGIES)}, not {strategy!r}")
    shared = {name: PoolNodes() for name in fleet.pools}
    clusters: dict[str, PooledCluster] = {}
    alone: dict[str, strategies.Strategy] = {}
    engines: dict[str, scaler_strategy.ScalerStrategy] = {}
    routers: dict[str, Router] = {}
    for member in fleet.members:
        if member.parts:
            starts = _start_parts(member, fleet, strategy=strategy)
            for part in member.parts:
                pool = _pool_config(member, fleet.pools[part.pool])
                clusters[part.key] = VariantCluster(
                    shared=shared[part.pool], trace=member.trace, profile=part.profile,
                    pool=pool, initial_replicas=starts[part.key], dt=dt,
                    gpus_per_replica=part.gpus_per_replica, warmup_s=run.WARMUP_S,
                    grace_s=member.grace_s, dispatch=member.dispatch)
            routers[member.key] = Router(
                parts=tuple(cast(VariantCluster, clusters[k]) for k in member.cluster_keys),
                capacities=tuple(p.capacity for p in member.parts))
            if strategy == "scaler":
                engines[member.key] = scaler_strategy.ScalerStrategy(
                    member.policy, start_epoch_s=member.trace.start_s,
                    deletion_cost=deletion_cost)
            else:
                first = member.parts[0]
                alone[first.key] = run.make_strategy(
                    strategy, policy=member.policy, profile=first.profile,
                    trace=member.trace, pool=_pool_config(member, fleet.pools[first.pool]))
            continue
        pool = _pool_config(member, fleet.pools[member.pool])
        clusters[member.key] = PooledCluster(
            shared=shared[member.pool], trace=member.trace, profile=member.profile,
            pool=pool, initial_replicas=_start_replicas(member, pool), dt=dt,
            gpus_per_replica=member.gpus_per_replica, warmup_s=run.WARMUP_S,
            grace_s=member.grace_s, dispatch=member.dispatch)
        if strategy == "scaler":
            engines[member.key] = scaler_strategy.ScalerStrategy(
                member.policy, start_epoch_s=member.trace.start_s,
                deletion_cost=deletion_cost)
        else:
            alone[member.key] = run.make_strategy(
                strategy, policy=member.policy, profile=member.profile, trace=member.trace,
                pool=pool)
    fleet_step = FleetScaler(fleet, engines) if strategy == "scaler" else None
    ledger = Ledger()
    begin = min(c.t0 for c in clusters.values())
    end = max(c.time_of_step(c.steps - 1) for c in clusters.values())
    due = {key: 0.0 for key in clusters}
    next_fleet = next_tally = 0.0
    finished: set[str] = set()
    horizon = max(m.trace.duration_s for m in fleet.members)
    for step in range(int(math.ceil((end - begin) / dt)) + 1):
        now = begin + step * dt
        active = {k: c for k, c in clusters.items() if k not in finished and c.step < c.steps
                  and c.time_of_step(c.step) <= now + 1e-9}
        for cluster in active.values():
            cluster.advance(now)
        if fleet_step is not None and now >= next_fleet - 1e-9 and now >= 0:
            ready = {k: c for k, c in clusters.items() if k not in finished}
            for key, replicas in fleet_step.decide(ready, now=now).items():
                ready[key].scale_to(replicas, now=now)
            next_fleet += CYCLE_S
        for key, baseline in alone.items():
            if key in active and now >= due[key] - 1e-9 and now >= 0:
                active[key].scale_to(baseline.decide(active[key], now=now), now=now)
                due[key] += baseline.period_s
        for key, router in routers.items():
            if fleet_member(fleet, key).cluster_keys[0] in active:
                router.route(now)
        for cluster in active.values():
            cluster.run_step(now)
        for key, cluster in active.items():
            if (now > cluster.trace.duration_s and cluster.drained) or (
                    cluster.step >= cluster.steps):
                finished.add(key)
                cluster.scale_to(0, now=now)
        if now >= next_tally - 1e-9 and now >= 0:
            _tally(fleet, clusters, ledger=ledger, now=now)
            next_tally += CYCLE_S
        if len(finished) == len(clusters):
            break
        if progress is not None and step % 500 == 0:
            progress(strategy, min(1.0, max(now, 0.0) / max(horizon, 1e-9)))
    models: dict[str, run.StrategyResult] = {}
    by_variant: dict[str, dict[str, float | int | str]] = {}
    for member in fleet.members:
        if member.parts:
            parts = [cast(VariantCluster, clusters[k]) for k in member.cluster_keys]
            summary, costs = _merged(member, parts)
            by_variant.update(costs)
            shown: PooledCluster = parts[0]  # its arrays hold every variant's answers
        else:
            shown = clusters[member.key]
            summary = run.summarize(shown, policy=member.policy, metric=member.metric,
                                    threshold=member.threshold_s,
                                    feasible_windows=set(member.feasible))
        models[member.key] = run.StrategyResult(
            name=strategy, summary=summary, series=run.series(shown, metric=member.metric))
    result = fleet_summary(fleet, models, ledger=ledger)
    if by_variant:
        result["by_variant"] = by_variant
    return FleetStrategyResult(name=strategy, models=models, fleet=result,
                               pool_series=_pool_series(ledger))


def fleet_member(fleet: Fleet, key: str) -> Member:
    """The model of the fleet with this key."""
    return next(m for m in fleet.members if m.key == key)


def _merged(member: Member, parts: Sequence[VariantCluster]
            ) -> tuple[dict[str, float | int], dict[str, dict[str, float | int | str]]]:
    """One summary of a model with variants, and its cost per variant (by part key).

    Each request was answered by the one variant it was routed to: its times are copied
    into the first variant's arrays (which are then the model's, for the SLO figures), a
    request is rejected only when every variant's context limit rejects it, and the cost
    figures are the sums of each variant's GPU time at its own price.
    """
    base = parts[0]
    for other in parts[1:]:
        mine = other.replica >= 0
        base.first_token[mine] = other.first_token[mine]
        base.done[mine] = other.done[mine]
        base.interrupted |= other.interrupted
    base.rejected = np.logical_and.reduce([c.rejected for c in parts])
    summary = run.summarize(base, policy=member.policy, metric=member.metric,
                            threshold=member.threshold_s, feasible_windows=set(member.feasible))
    costs: dict[str, dict[str, float | int | str]] = {}
    until = member.trace.duration_s
    for part, cluster in zip(member.parts, parts, strict=True):
        served = (cluster.replica[cluster.first:] >= 0) & np.isfinite(
            cluster.done[cluster.first:])
        if cluster is base:  # its arrays now hold every variant's times
            served = (base.replica[base.first:] >= 0) & served
        price = engine_cost.of_gpu_time(
            allocated_gpu_seconds=cluster.gpu_seconds(until=until),
            useful_gpu_seconds=cluster.useful_gpu_s, gpu_hourly=part.gpu_hourly,
            requests=int(served.sum()))
        costs[part.key] = {
            "pool": part.pool, "profile": part.profile.name,
            "completed": int(served.sum()),
            "gpu_hours": round(price.allocated_gpu_hours, 4), "cost": round(price.cost, 4),
            "idle_cost": round(price.idle_cost, 4), "max_replicas": cluster.max_spec,
            "scale_events": cluster.scale_events}
    total = sum(float(c["cost"]) for c in costs.values())
    completed = int(summary["completed"])
    summary.update({
        "gpu_hours": round(sum(float(c["gpu_hours"]) for c in costs.values()), 4),
        "cost": round(total, 4),
        "idle_cost": round(sum(float(c["idle_cost"]) for c in costs.values()), 4),
        "cost_per_1k_requests": round(total / completed * 1000, 4) if completed else 0.0,
        "scale_events": sum(int(c["scale_events"]) for c in costs.values()),
        # The sum of each variant's peak (they need not peak at once).
        "max_replicas": sum(int(c["max_replicas"]) for c in costs.values())})
    return summary, costs


def _tally(fleet: Fleet, clusters: Mapping[str, PooledCluster], *, ledger: Ledger,
           now: float) -> None:
    """One cycle's GPUs: held per pool and tier, and which limits they exceed.

    A limit is exceeded when the GPUs of serving replicas (bound to a node, not draining)
    it covers are above it: a budget's maxGpus over its models (on its pool, or on all),
    a pool's GPUs less its reservations over every model on it. Replicas draining after a
    scale-down are leaving (they take no new requests) and are not counted against a
    limit; they are in the held GPUs of the report.
    """
    serving: dict[str, int] = {}
    ledger.t.append(now)
    for name in fleet.pools:
        tiers = ledger.by_tier.setdefault(name, {t.value: [] for t in vocabulary.Tier})
        held_by_tier = dict.fromkeys(tiers, 0)
        for member, key in fleet.clusters_on(name):
            on_node, held = clusters[key].held_gpus()
            serving[key] = on_node
            held_by_tier[member.tier.value] += held
        for tier, values in tiers.items():
            values.append(held_by_tier[tier])
        ledger.peak[name] = max(ledger.peak.get(name, 0), sum(held_by_tier.values()))
    exceeded: list[str] = []
    for name, pool in sorted(fleet.pools.items()):
        if pool.spec.reserved_gpus and sum(
                serving[k] for _, k in fleet.clusters_on(name)) > pool.spec.shareable_gpus:
            exceeded.extend(f"reservation {name}/{r.name}" for r in pool.spec.reservations)
    for name, budget in sorted(fleet.budgets.items()):
        covered = [k for m in fleet.members for k in m.cluster_keys
                   if budget.covers(m.policy) and budget.spec.pool in (None, m.pool_of(k))]
        if sum(serving[k] for k in covered) > budget.spec.max_gpus:
            exceeded.append(f"budget {name}")
    if exceeded:
        ledger.cycles_over += 1
        for what in exceeded:
            ledger.over[what] = ledger.over.get(what, 0) + 1


def _pool_series(ledger: Ledger) -> dict[str, dict[str, list[float]]]:
    """Per pool, every SERIES_S: `t` and the GPUs held by each tier at that time."""
    every = max(1, int(round(SERIES_S / CYCLE_S)))
    out: dict[str, dict[str, list[float]]] = {}
    for name, tiers in ledger.by_tier.items():
        series: dict[str, list[float]] = {"t": ledger.t[::every]}
        for tier, values in tiers.items():
            series[tier] = [float(v) for v in values[::every]]
        out[name] = series
    return out


def _costs(summaries: Sequence[Mapping[str, float | int]]) -> dict[str, float | int]:
    """GPU-hours, cost, idle cost and cost per 1k completed requests of some models."""
    cost = sum(float(s["cost"]) for s in summaries)
    completed = sum(int(s["completed"]) for s in summaries)
    return {
        "models": len(summaries),
        "requests": sum(int(s["requests"]) for s in summaries),
        "completed": completed,
        "gpu_hours": round(sum(float(s["gpu_hours"]) for s in summaries), 4),
        "cost": round(cost, 4),
        "idle_cost": round(sum(float(s["idle_cost"]) for s in summaries), 4),
        # As a model's: 0 when nothing completed (no price per request).
        "cost_per_1k_requests": round(cost / completed * 1000, 4) if completed else 0.0,
    }


def _slo(summaries: Sequence[Mapping[str, float | int]]) -> dict[str, float | int]:
    """A tier's SLO: requests within it over all judged, feasible windows met over all."""
    judged = sum(int(s["requests"]) - int(s.get("rejected", 0)) for s in summaries)
    within = sum(float(s["slo_attainment"]) * (int(s["requests"]) - int(s.get("rejected", 0)))
                 for s in summaries)
    windows = sum(int(s.get("feasible_windows", 0)) for s in summaries)
    met = sum(float(s["p95_windows_met"]) * int(s.get("feasible_windows", 0))
              for s in summaries)
    return {"models": len(summaries),
            "slo_attainment": round(within / judged, 6) if judged else 1.0,
            "p95_windows_met": round(met / windows, 6) if windows else 1.0,
            "feasible_windows": windows,
            "unfinished": sum(int(s.get("unfinished", 0)) for s in summaries),
            "interrupted_requests": _interrupted(summaries)}


def _interrupted(summaries: Sequence[Mapping[str, float | int]]) -> int:
    """Requests of these models cut by a scale-down (a part of their unfinished ones)."""
    return sum(int(s.get("interrupted_requests", 0)) for s in summaries)


def fleet_summary(fleet: Fleet, models: Mapping[str, run.StrategyResult], *, ledger: Ledger
                  ) -> dict[str, Any]:
    """The `fleet` object of one strategy (DESIGN 4.6)."""

    def grouped(label: Callable[[Member], str | None]) -> dict[str, dict[str, float | int]]:
        keys = sorted({label(m) or UNLABELLED for m in fleet.members})
        return {key: _costs([models[m.key].summary for m in fleet.members
                             if (label(m) or UNLABELLED) == key]) for key in keys}

    tiers = sorted({m.tier for m in fleet.members}, key=list(vocabulary.Tier).index)
    return {
        **_costs([r.summary for r in models.values()]),
        "by_tenant": grouped(lambda m: m.policy.tenant),
        "by_cost_center": grouped(lambda m: m.policy.cost_center),
        "peak_gpus": {name: ledger.peak.get(name, 0) for name in sorted(fleet.pools)},
        "budget_violations": ledger.cycles_over,
        "violations_by": dict(sorted(ledger.over.items())),
        "interrupted_requests": _interrupted([r.summary for r in models.values()]),
        "by_tier": {tier.value: _slo([models[m.key].summary for m in fleet.members
                                      if m.tier is tier]) for tier in tiers},
    }


def simulate_fleet(fleet: Fleet, *, names: Sequence[str] = FLEET_STRATEGIES,
                   seed: int = 0, dt: float = 0.1, progress: run.Progress | None = None,
                   deletion_cost: bool = True) -> FleetResult:
    """Replay the fleet under each named strategy (each from the same start);
    `deletion_cost=False` as in `replay` (`--no-deletion-cost`)."""
    results = {name: replay(fleet, strategy=name, dt=dt, progress=progress,
                            deletion_cost=deletion_cost) for name in names}
    return FleetResult(fleet=fleet, seed=seed, results=results)

