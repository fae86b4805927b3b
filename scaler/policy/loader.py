"""Loading ScalePolicy, GpuPool and GpuBudget files and folders, with errors that name
file, document and field."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, get_args

import pydantic
import yaml

from scaler.core import errors
from scaler.policy import fleet, model

POLICY_SUFFIXES = (".yaml", ".yml")

MAX_FILE_BYTES = 1024 * 1024
"""Largest policy file read, in bytes. 1 MiB holds hundreds of policies (one is about
1-2 KiB); a 50 MB file took PyYAML a minute and 580 MB to parse, so larger files are
refused before parsing (`policies.max_file_bytes` in the service)."""


Reason = Literal["unreadable", "yaml", "not_a_policy", "invalid_field", "duplicate"]
REASONS: tuple[Reason, ...] = get_args(Reason)
"""What kind of problem a PolicyError is: a closed set, so it can be a metric label
(`scaler_policy_invalid{reason}`) where the message, free text, cannot."""


@dataclass(frozen=True, slots=True)
class PolicyError:
    """One problem in one document: `path` file, `document` index (0-based), `field` path,
    `reason` its kind (REASONS)."""

    path: str
    document: int | None
    field: str
    message: str
    reason: Reason = "invalid_field"

    def __str__(self) -> str:
        where = self.path if self.document is None else f"{self.path} (document {self.document})"
        return errors.located(where, self.field, self.message)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "document": self.document, "field": self.field,
                "message": self.message}


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A valid policy and where it came from."""

    policy: model.ScalePolicy
    path: str
    document: int

    @property
    def where(self) -> str:
        return f"{self.path} (document {self.document})"


FleetObject = TypeVar("FleetObject", fleet.GpuPool, fleet.GpuBudget)


@dataclass(frozen=True, slots=True)
class Loaded(Generic[FleetObject]):
    """A valid GpuPool or GpuBudget and where it came from."""

    value: FleetObject
    path: str
    document: int

    @property
    def where(self) -> str:
        return f"{self.path} (document {self.document})"


@dataclass(slots=True)
class LoadResult:
    """What a load found: valid policies, pools and budgets (each with its file), errors."""

    loaded: list[LoadedPolicy] = field(default_factory=list)
    errors: list[PolicyError] = field(default_factory=list)
    pools: list[Loaded[fleet.GpuPool]] = field(default_factory=list)
    budgets: list[Loaded[fleet.GpuBudget]] = field(default_factory=list)

    def extend(self, other: LoadResult) -> None:
        """Add everything `other` found (collisions are resolved later, by the caller)."""
        self.loaded.extend(other.loaded)
        self.errors.extend(other.errors)
        self.pools.extend(other.pools)
        self.budgets.extend(other.budgets)

    @property
    def policies(self) -> list[model.ScalePolicy]:
        return [item.policy for item in self.loaded]

    @property
    def ok(self) -> bool:
        return not self.errors


class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a key repeated in one mapping is an error.

    SafeLoader keeps the last value silently, so `replicas: {max: 4}` followed later by
    `replicas: {max: 400}` would scale to 400 with no word. Keys brought in by a merge
    (`<<: *defaults`) may still be overridden, as YAML intends.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False
                          ) -> dict[Hashable, Any]:
        seen: dict[Hashable, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # SafeLoader's own error for an unhashable key follows
            first = seen.setdefault(key, key_node.start_mark)
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r} (first on line {first.line + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def validation_errors(exc: pydantic.ValidationError, path: str, index: int) -> list[PolicyError]:
    return [PolicyError(path=path, document=index, field=problem.field, message=problem.message)
            for problem in errors.field_problems(
                exc, unknown_field="unknown field (check the spelling; fields are camelCase)")]


KINDS = (model.KIND, fleet.POOL_KIND, fleet.BUDGET_KIND)
"""The kinds of scaler.io documents a file may hold."""
GROUP_PREFIX = "scaler.io/"


def parse_documents(text: str, path: str) -> LoadResult:
    """Parse every YAML document in `text`; empty documents are skipped, and so are the
    documents of other API groups (a ConfigMap bundle may share the file)."""
    result = LoadResult()
    try:
        documents = list(yaml.load_all(text, Loader=StrictLoader))  # a SafeLoader
    except yaml.YAMLError as exc:
        result.errors.append(PolicyError(path=path, document=None, field="",
                                         message=errors.yaml_problem(exc), reason="yaml"))
        return result
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            result.errors.append(PolicyError(
                path=path, document=index, field="",
                message="expected a mapping (a ScalePolicy, GpuPool or GpuBudget), got "
                        f"{type(document).__name__}",
                reason="not_a_policy"))
            continue
        kind = document.get("kind")
        if kind not in (None, *KINDS):
            if str(document.get("apiVersion", "")).startswith(GROUP_PREFIX):
                # Ours, misspelt: skipping it would drop a pool or budget without a word.
                result.errors.append(PolicyError(
                    path=path, document=index, field="kind",
                    message=f"unknown kind {kind!r} for {document['apiVersion']}: one of "
                            f"{', '.join(KINDS)}", reason="not_a_policy"))
            # Other Kubernetes objects may share a file (e.g. a ConfigMap bundle): not ours.
            continue
        try:
            if kind == fleet.POOL_KIND:
                pool = fleet.GpuPool.model_validate(document)
                result.pools.append(Loaded(value=pool, path=path, document=index))
            elif kind == fleet.BUDGET_KIND:
                budget = fleet.GpuBudget.model_validate(document)
                result.budgets.append(Loaded(value=budget, path=path, document=index))
            else:
                policy = model.ScalePolicy.model_validate(document)
                result.loaded.append(LoadedPolicy(policy=policy, path=path, document=index))
        except pydantic.ValidationError as exc:
            result.errors.extend(validation_errors(exc, path, index))
    return result


def iter_policy_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Files named directly, and every *.yaml / *.yml under named folders (sorted, no dotfiles).

    Dotfiles are skipped because a Kubernetes ConfigMap volume keeps its real files under
    '..data' / '..2024_...' and exposes them through symlinks at the top: reading both would
    load every policy twice.
    """
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                rel = child.relative_to(path)
                if any(part.startswith(".") for part in rel.parts):
                    continue
                if child.suffix in POLICY_SUFFIXES and child.is_file():
                    yield child
        else:
            yield path


def read_limited(path: Path, *, max_bytes: int) -> bytes:
    """At most `max_bytes + 1` bytes of `path`: enough to tell a file is over the limit
    without holding a huge one in memory (it may grow between a stat and the read)."""
    with path.open("rb") as stream:
        return stream.read(max_bytes + 1)


def _read(path: Path, *, max_bytes: int) -> str | PolicyError:
    def problem(message: str) -> PolicyError:
        return PolicyError(path=str(path), document=None, field="", message=message,
                           reason="unreadable")

    try:
        data = read_limited(path, max_bytes=max_bytes)
    except OSError as exc:
        return problem(f"cannot read: {exc.strerror or exc}")
    if len(data) > max_bytes:
        try:
            size = f"{path.stat().st_size:,} bytes"
        except OSError:
            size = "larger"
        return problem(f"file is {size}, over the limit of {max_bytes:,} bytes "
                       "(policies.max_file_bytes): not parsed; split it into smaller files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return problem("not UTF-8 text")


def load_paths(
    paths: Iterable[Path],
    *,
    in_force: Mapping[str, LoadedPolicy] | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> LoadResult:
    """Load every policy under `paths`. Invalid documents become errors; valid ones load.

    Cross-file checks: two policies with the same namespace/name, or two policies that
    target the same object, collide and only one loads (`_resolve_collisions`). `in_force`
    (model key -> the loaded policy now running, for a reload) decides who wins: the policy
    in force stays, whatever the file names.
    """
    result = LoadResult()
    for path in iter_policy_files(paths):
        text = _read(path, max_bytes=max_file_bytes)
        if isinstance(text, PolicyError):
            result.errors.append(text)
            continue
        result.extend(parse_documents(text, str(path)))
    return _resolve_collisions(result, in_force or {})


def combine(*parts: LoadResult, in_force: Mapping[str, LoadedPolicy] | None = None
            ) -> LoadResult:
    """Several loads as one (files first, then ScalePolicy resources), with the collisions
    across them resolved as between two files: the policy in force wins, else the earlier."""
    result = LoadResult()
    for part in parts:
        result.extend(part)
    return _resolve_collisions(result, in_force or {})


TargetKey = tuple[str, str, str, str]
"""(namespace, apiVersion, kind, name) of a scaled object."""


def target_key(policy: model.ScalePolicy) -> TargetKey:
    target = policy.spec.target
    return (policy.metadata.namespace, target.api_version, target.kind, target.name)


def _resolve_collisions(result: LoadResult, in_force: Mapping[str, LoadedPolicy]) -> LoadResult:
    """Keep one policy per model key and per target; the others become errors.

    Who wins, in this order:
    1. The policy in force: a candidate whose model key is in force from the same file.
       A file that now has errors still holds the keys and targets in force from it (its
       last good version stays, `service.policies.merge`), so a newcomer cannot take over
       a model by breaking, or racing, the file that defines it.
    2. Otherwise (the first load, `scaler validate`, a policy that moved to another file):
       the file whose path sorts first, then the lower document index. The others are
       errors that name the winner's file.
    """
    broken = {error.path for error in result.errors}
    present = {(item.policy.key, item.path) for item in result.loaded}
    by_key: dict[str, LoadedPolicy] = {}
    by_target: dict[TargetKey, LoadedPolicy] = {}
    for key, running in in_force.items():
        if running.path in broken and (key, running.path) not in present:
            by_key[key] = running
            by_target[target_key(running.policy)] = running
    # Stable sort: the policies in force first, then the order the files loaded in.
    order = sorted(range(len(result.loaded)),
                   key=lambda index: not _is_in_force(result.loaded[index], in_force))
    kept: set[int] = set()
    for index in order:
        item = result.loaded[index]
        policy = item.policy
        holder = by_key.get(policy.key)
        if holder is not None:
            result.errors.append(_collision(item, holder, in_force=in_force,
                                            field="metadata.name",
                                            what=f"policy {policy.key} is already defined"))
            continue
        target = target_key(policy)
        holder = by_target.get(target)
        if holder is not None:
            kind, name = policy.spec.target.kind, policy.spec.target.name
            result.errors.append(_collision(
                item, holder, in_force=in_force, field="spec.target",
                what=f"{kind} {policy.metadata.namespace}/{name} is already scaled by policy "
                     f"{holder.policy.key}"))
            continue
        by_key[policy.key] = item
        by_target[target] = item
        kept.add(index)
    result.loaded = [item for index, item in enumerate(result.loaded) if index in kept]
    result.pools = _first_of_each_name(result.pools, result.errors)
    result.budgets = _first_of_each_name(result.budgets, result.errors)
    return result


def _first_of_each_name(items: list[Loaded[FleetObject]], problems: list[PolicyError]
                        ) -> list[Loaded[FleetObject]]:
    """One pool (or budget) per name: the first in load order; the others become errors."""
    by_name: dict[str, Loaded[FleetObject]] = {}
    for item in items:
        holder = by_name.setdefault(item.value.name, item)
        if holder is not item:
            problems.append(PolicyError(
                path=item.path, document=item.document, field="metadata.name",
                message=f"{item.value.kind} {item.value.name} is already defined in "
                        f"{holder.where}, which wins (files load in path order, then by "
                        "document): this definition is rejected", reason="duplicate"))
    return list(by_name.values())


def _is_in_force(item: LoadedPolicy, in_force: Mapping[str, LoadedPolicy]) -> bool:
    running = in_force.get(item.policy.key)
    return running is not None and running.path == item.path


def _collision(item: LoadedPolicy, holder: LoadedPolicy, *,
               in_force: Mapping[str, LoadedPolicy], field: str, what: str) -> PolicyError:
    if holder.path != item.path and _is_in_force(holder, in_force):
        why = "which is in force: this definition is rejected and the policy in force stays"
    else:
        why = ("which wins (files load in path order, then by document): this definition "
               "is rejected")
    return PolicyError(path=item.path, document=item.document, field=field,
                       message=f"{what} in {holder.where}, {why}", reason="duplicate")


# -- references across files (`scaler validate`) ---------------------------------------------


def reference_errors(result: LoadResult) -> list[PolicyError]:
    """What the valid documents of a load get wrong about each other, each error at one
    document and naming the other's file: a policy on a pool no GpuPool defines (when any
    does) or disagreeing with its GpuPool, a budget on a missing pool, two budgets for the
    same owner and pool, guarantees above the pools' unreserved GPUs."""
    pools = {item.value.name: item for item in result.pools}
    problems: list[PolicyError] = []
    for item in result.loaded:
        problems += _policy_on_pool(item, pools)
        problems += _variants_on_pools(item, pools)
    problems += _budget_owners(result.budgets)
    problems += _guarantees(result.budgets, pools)
    return problems


def _pool_list(pools: Mapping[str, Loaded[fleet.GpuPool]]) -> str:
    if not pools:
        return "no GpuPool is defined"
    return "defined: " + ", ".join(f"{name} in {item.where}"
                                   for name, item in sorted(pools.items()))


def _policy_on_pool(item: LoadedPolicy, pools: Mapping[str, Loaded[fleet.GpuPool]]
                    ) -> list[PolicyError]:
    spec = item.policy.spec
    if spec.node_pool is None or not pools:
        return []  # without pool files, spec.nodePool is the whole truth

    def problem(field: str, message: str) -> PolicyError:
        return PolicyError(path=item.path, document=item.document, field=field, message=message)

    held = pools.get(spec.node_pool.name)
    if held is None:
        return [problem("spec.nodePool.name", f"names GpuPool {spec.node_pool.name!r}, which "
                        f"is not defined ({_pool_list(pools)})")]
    pool, where = held.value.spec, f"GpuPool {held.value.name} in {held.where}"
    problems = []
    if spec.resources.resource_name != pool.resource_name:
        problems.append(problem("spec.resources.resourceName", (
            f"{spec.resources.resource_name}, but {where} offers {pool.resource_name}")))
    if spec.node_pool.gpus_per_node != pool.gpus_per_node:
        problems.append(problem("spec.nodePool.gpusPerNode", (
            f"{spec.node_pool.gpus_per_node}, but {where} has {pool.gpus_per_node} GPUs per "
            "node")))
    if spec.node_pool.max_nodes is not None and spec.node_pool.max_nodes > pool.max_nodes:
        problems.append(problem("spec.nodePool.maxNodes", (
            f"{spec.node_pool.max_nodes}, above the {pool.max_nodes} nodes of {where}")))
    domain = pool.topology.nvlink_domain_gpus if pool.topology else None
    if domain is not None and spec.resources.gpus_per_replica > domain:
        problems.append(problem("spec.resources.gpusPerReplica", (
            f"{spec.resources.gpus_per_replica} GPUs per replica do not fit in one NVLink "
            f"domain of {domain} GPUs of {where}: a tensor-parallel replica needs one")))
    return problems


def _variants_on_pools(item: LoadedPolicy, pools: Mapping[str, Loaded[fleet.GpuPool]]
                       ) -> list[PolicyError]:
    """Each variant's pool must be a GpuPool (when any is defined), with the variant's
    resourceName, and a replica of it must fit on one of its nodes."""
    if not pools:
        return []
    problems = []
    for index, variant in enumerate(item.policy.spec.variants):
        field = f"spec.variants[{index}]"
        held = pools.get(variant.node_pool)
        if held is None:
            message = (f"variant {variant.name} names GpuPool {variant.node_pool!r}, which is "
                       f"not defined ({_pool_list(pools)})")
            problems.append(PolicyError(path=item.path, document=item.document,
                                        field=f"{field}.nodePool", message=message))
            continue
        pool, where = held.value.spec, f"GpuPool {held.value.name} in {held.where}"
        resources = variant.resources
        if resources.resource_name != pool.resource_name:
            problems.append(PolicyError(
                path=item.path, document=item.document, field=f"{field}.resources.resourceName",
                message=f"{resources.resource_name}, but {where} offers {pool.resource_name}"))
        if resources.gpus_per_replica > pool.gpus_per_node:
            problems.append(PolicyError(
                path=item.path, document=item.document,
                field=f"{field}.resources.gpusPerReplica",
                message=f"{resources.gpus_per_replica} GPUs per replica do not fit on a node "
                f"of {where} ({pool.gpus_per_node} GPUs)"))
    return problems


def _budget_owners(budgets: list[Loaded[fleet.GpuBudget]]) -> list[PolicyError]:
    """Two budgets for one owner on one pool would be two ceilings for the same GPUs."""
    problems = []
    seen: dict[tuple[str, str, str | None], Loaded[fleet.GpuBudget]] = {}
    for item in budgets:
        spec = item.value.spec
        label, owner = spec.owner
        first = seen.setdefault((label, owner, spec.pool), item)
        if first is not item:
            where = "every pool" if spec.pool is None else f"pool {spec.pool}"
            problems.append(PolicyError(
                path=item.path, document=item.document,
                field="spec.tenant" if label == "tenant" else "spec.costCenter",
                message=f"{label} {owner} on {where} is already covered by GpuBudget "
                        f"{first.value.name} in {first.where}: merge the two"))
    return problems


def _guarantees(budgets: list[Loaded[fleet.GpuBudget]],
                pools: Mapping[str, Loaded[fleet.GpuPool]]) -> list[PolicyError]:
    """A budget on a missing pool; guarantees that the pools cannot all keep at once.

    Per pool, the guarantees naming it must fit in its unreserved GPUs (64 GPUs with 16
    reserved for training guarantee at most 48); all guarantees together, those on every
    pool included, must fit in all pools' unreserved GPUs.
    """
    problems = []
    guaranteed: list[Loaded[fleet.GpuBudget]] = []
    for item in budgets:
        spec = item.value.spec
        if spec.pool is not None and spec.pool not in pools:
            problems.append(PolicyError(
                path=item.path, document=item.document, field="spec.pool",
                message=f"names GpuPool {spec.pool!r}, which is not defined "
                        f"({_pool_list(pools)})"))
        elif spec.guaranteed_gpus > 0:
            guaranteed.append(item)
    for name, held in sorted(pools.items()):
        problems += _over([item for item in guaranteed if item.value.spec.pool == name],
                          shareable=held.value.spec.shareable_gpus,
                          reserved=held.value.spec.reserved_gpus,
                          what=f"GpuPool {name} in {held.where}")
    if any(item.value.spec.pool is None for item in guaranteed):
        problems += _over(
            guaranteed, shareable=sum(i.value.spec.shareable_gpus for i in pools.values()),
            reserved=sum(i.value.spec.reserved_gpus for i in pools.values()),
            what=f"all pools together ({_pool_list(pools)})")
    return problems


def _over(guarantees: list[Loaded[fleet.GpuBudget]], *, shareable: int, reserved: int,
          what: str) -> list[PolicyError]:
    """One error, at the budget whose guarantee takes the running sum above `shareable`
    GPUs, naming the others: 32 + 24 on a pool of 48 unreserved is an error at the second."""
    running = 0
    for item in guarantees:
        running += item.value.spec.guaranteed_gpus
        if running > shareable:
            total = sum(each.value.spec.guaranteed_gpus for each in guarantees)
            others = ", ".join(f"{each.value.name}: {each.value.spec.guaranteed_gpus} in "
                               f"{each.where}" for each in guarantees if each is not item)
            return [PolicyError(
                path=item.path, document=item.document, field="spec.guaranteedGpus",
                message=f"the guarantees on {what} come to {total} GPUs"
                        + (f" with {others}" if others else "")
                        + f", above its {shareable} unreserved GPUs ({reserved} reserved)")]
    return []
