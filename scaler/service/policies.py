"""Policy hot reload: detect file changes (ConfigMap symlink swaps too), keep the last good."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from scaler.policy import fleet, loader, shards

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PolicySet:
    """The policies in force after a load, and what the load said.

    policies: model key -> the loaded policy (with its file and document).
    kept: keys whose file now has errors, so their last good version stays in force.
    errors: every problem of the latest load.
    pools, budgets: GpuPool and GpuBudget name -> the loaded object, kept like policies.
    """

    policies: Mapping[str, loader.LoadedPolicy]
    kept: tuple[str, ...] = ()
    errors: tuple[loader.PolicyError, ...] = ()
    pools: Mapping[str, loader.Loaded[fleet.GpuPool]] = dataclasses.field(default_factory=dict)
    budgets: Mapping[str, loader.Loaded[fleet.GpuBudget]] = dataclasses.field(
        default_factory=dict)

    @property
    def fleet(self) -> fleet.Fleet:
        """The pools and budgets in force."""
        return fleet.Fleet(pools={name: item.value for name, item in self.pools.items()},
                           budgets={name: item.value for name, item in self.budgets.items()})


Item = TypeVar("Item", loader.LoadedPolicy, loader.Loaded[fleet.GpuPool],
               loader.Loaded[fleet.GpuBudget])


def _keep_last_good(fresh: dict[str, Item], previous: Mapping[str, Item],
                    broken_files: set[str]) -> list[str]:
    """Add to `fresh` what `previous` had from a file that now has errors; the keys kept."""
    kept = []
    for key, item in previous.items():
        if key not in fresh and item.path in broken_files:
            fresh[key] = item
            kept.append(key)
    return sorted(kept)


def merge(previous: Mapping[str, loader.LoadedPolicy], result: loader.LoadResult, *,
          fleet_in_force: PolicySet | None = None) -> PolicySet:
    """The new policy set from a load, keeping the last good version where a file broke.

    A policy missing from the new load stays if its file now has an error (a typo in an
    edit must not delete the model's scaling, DESIGN 4.1); it goes if its file is gone or
    loads cleanly without it (a deliberate removal). A file with errors keeps every policy
    it had, since a broken document cannot say which model it was meant to be. The pools
    and budgets of `fleet_in_force` (the set in force) are kept the same way.
    """
    policies = {item.policy.key: item for item in result.loaded}
    pools = {item.value.name: item for item in result.pools}
    budgets = {item.value.name: item for item in result.budgets}
    broken_files = {error.path for error in result.errors}
    kept = _keep_last_good(policies, previous, broken_files)
    if fleet_in_force is not None:
        kept_fleet = ([f"{fleet.POOL_KIND} {name}" for name in
                       _keep_last_good(pools, fleet_in_force.pools, broken_files)]
                      + [f"{fleet.BUDGET_KIND} {name}" for name in
                         _keep_last_good(budgets, fleet_in_force.budgets, broken_files)])
        for what in kept_fleet:
            log.warning("%s: the new version is invalid; the last good one stays", what)
    return PolicySet(policies=policies, kept=tuple(kept), errors=tuple(result.errors),
                     pools=pools, budgets=budgets)


def only(policy_set: PolicySet, share: shards.Share) -> PolicySet:
    """The part of `policy_set` one shard evaluates: its models, pools and budgets (the
    load's errors stay whole: every shard reads every file)."""
    return dataclasses.replace(
        policy_set,
        policies={k: v for k, v in policy_set.policies.items() if k in share.models},
        kept=tuple(key for key in policy_set.kept if key in share.models),
        pools={k: v for k, v in policy_set.pools.items() if k in share.pools},
        budgets={k: v for k, v in policy_set.budgets.items() if k in share.budgets})


def fingerprint(
    paths: Iterable[Path], *, max_file_bytes: int = loader.MAX_FILE_BYTES
) -> tuple[tuple[str, str], ...]:
    """(path, sha256 of content) of every policy file: changes whenever any content does.

    Content, not mtime or inode: a ConfigMap update swaps the `..data` symlink to a new
    folder, so the same path suddenly shows other bytes with an mtime that can even go
    back; hashing a few hundred small files every 2 s costs well under a millisecond each.
    A file over `max_file_bytes` is hashed only that far, with its size: it is an error
    anyway, and reading 50 MB every 2 s would cost more than the whole watcher.
    """
    prints = []
    for path in loader.iter_policy_files(paths):
        try:
            data = loader.read_limited(path, max_bytes=max_file_bytes)
            digest = hashlib.sha256(data).hexdigest()
            if len(data) > max_file_bytes:
                digest = f"oversized {path.stat().st_size}: {digest}"
        except OSError as error:
            digest = f"unreadable: {error.strerror or error}"
        prints.append((str(path), digest))
    return tuple(prints)


Apply = Callable[[PolicySet], Awaitable[None]]


class ResourcePolicies(Protocol):
    """Policies, pools and budgets from ScalePolicy, GpuPool and GpuBudget resources
    (`actuators.policy_resources.PolicyResources`)."""

    def fingerprint(self) -> Hashable:
        """Changes whenever a resource's spec does."""
        ...

    def load(self) -> loader.LoadResult:
        """Every resource, parsed."""
        ...


class PolicyWatcher:
    """Polls the policy paths; loads and hands over a merged set when anything changed."""

    def __init__(self, paths: Sequence[Path], *, poll_seconds: float, apply: Apply,
                 max_file_bytes: int = loader.MAX_FILE_BYTES,
                 resources: ResourcePolicies | None = None) -> None:
        self.paths = tuple(paths)
        self.resources = resources
        self._resources_print: Hashable = None
        self.poll_seconds = poll_seconds
        self.max_file_bytes = max_file_bytes
        self._apply = apply
        self._print: tuple[tuple[str, str], ...] | None = None
        self.current: PolicySet = PolicySet(policies={})

    async def load_now(self) -> PolicySet:
        """Load (or reload) at once and apply; returns the set now in force."""
        current_print = await asyncio.to_thread(self._fingerprint)
        # The policies in force win collisions: a new file reusing a model's name or
        # target is rejected, whatever its file name sorts like.
        result = await asyncio.to_thread(
            functools.partial(loader.load_paths, self.paths, in_force=self.current.policies,
                              max_file_bytes=self.max_file_bytes))
        if self.resources is not None:
            # Files first: on a first load a file wins a collision with a resource.
            self._resources_print = self.resources.fingerprint()
            result = loader.combine(result, self.resources.load(),
                                    in_force=self.current.policies)
        merged = merge(self.current.policies, result, fleet_in_force=self.current)
        self._print = current_print
        self.current = merged
        for error in merged.errors:
            log.error("invalid policy: %s", error, extra={
                "path": error.path, "document": error.document, "field": error.field})
        for key in merged.kept:
            log.warning("policy %s: the new version is invalid; the last good one stays", key)
        if not merged.policies and not merged.errors:
            log.warning("no ScalePolicy found in %s: no model is scaled",
                        ", ".join(str(path) for path in self.paths))
        log.info("policies loaded: %d in force, %d problems", len(merged.policies),
                 len(merged.errors))
        await self._apply(merged)
        return merged

    def _fingerprint(self) -> tuple[tuple[str, str], ...]:
        return fingerprint(self.paths, max_file_bytes=self.max_file_bytes)

    async def changed(self) -> bool:
        current_print = await asyncio.to_thread(self._fingerprint)
        if self.resources is not None and self.resources.fingerprint() != self._resources_print:
            return True
        return current_print != self._print

    async def run(self) -> None:
        """Until cancelled: every poll interval, reload if any file changed."""
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                if await self.changed():
                    await self.load_now()
            except Exception:  # a failed reload keeps what is in force; try again later
                log.exception("policy reload failed")
