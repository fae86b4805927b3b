"""GpuPool and GpuBudget: the fleet's pool and budget files (DESIGN 4.6), and the Fleet."""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from scaler.policy import model

if TYPE_CHECKING:  # loader imports this module to parse the documents
    from scaler.policy import loader

POOL_KIND = "GpuPool"
BUDGET_KIND = "GpuBudget"

# A Kubernetes label value (what a tenant or cost-center label holds): at most 63
# characters, alphanumeric at both ends, '-', '_' and '.' inside.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


# The ScalePolicy's base: camelCase aliases, unknown fields rejected, frozen.
_Model = model._Model


class FleetMetadata(_Model):
    """The object's name; pools and budgets are cluster-wide, so there is no namespace."""

    name: str = Field(description="The name (a DNS-1123 label) that policies and budgets "
                      "refer to.")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="Free labels, for your own tooling.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return model._dns_name(value, "name")


class Reservation(_Model):
    """GPUs of a pool held for work the scaler does not scale (training, a benchmark)."""

    name: str = Field(description="What the capacity is held for (a DNS-1123 label), "
                      "named in explanations.")
    gpus: int = Field(ge=1, description="GPUs held: never given to a scaled model.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return model._dns_name(value, "reservation name")


class Topology(_Model):
    """How a pool's GPUs are connected, for tensor-parallel replicas that need one domain."""

    nvlink_domain_gpus: int = Field(
        ge=1, description="GPUs of one NVLink domain: a tensor-parallel replica must fit in "
        "one (8 on an HGX H100 server, 72 on a GB200 NVL72 rack).")


class GpuPoolSpec(_Model):
    """One pool of identical GPU nodes, shared by the models that name it."""

    resource_name: str = Field(
        default="nvidia.com/gpu", description="Extended resource the pool's nodes offer, "
        "including MIG profiles such as nvidia.com/mig-1g.10gb. Default: a whole NVIDIA GPU.")
    gpus_per_node: int = Field(
        ge=1, description="GPUs (of resourceName) per node, e.g. 8 on an H100 server or 56 "
        "MIG 1g.10gb slices on an 8 x A100-80GB one. No default: it is the hardware's.")
    max_nodes: int = Field(
        ge=1, description="Most nodes the pool may have (the cloud quota or the node group's "
        "max): the pool's GPUs are gpusPerNode x maxNodes. Required: budgets are checked "
        "against it.")
    gpu_hourly: float = Field(
        default=2.5, ge=0, description="Price of one GPU (of resourceName) for one hour, in "
        "your currency. 2.5: a typical on-demand H100 hour in 2025, as spec.cost.gpuHourly.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels that pick the pool's nodes. Empty: "
        "any node with the GPU resource.")
    topology: Topology | None = Field(
        default=None, description="NVLink domains, when a tensor-parallel replica must fit "
        "in one. None: any gpusPerNode GPUs of a node will do.")
    reservations: tuple[Reservation, ...] = Field(
        default=(), description="Capacity held for work the scaler does not scale, such as "
        "training: never given to a scaled model, never counted for guarantees.")

    @field_validator("resource_name")
    @classmethod
    def _resource(cls, value: str) -> str:
        return model._resource_name(value)

    @model_validator(mode="after")
    def _cross(self) -> GpuPoolSpec:
        names = [each.name for each in self.reservations]
        twice = sorted(name for name, n in collections.Counter(names).items() if n > 1)
        if twice:
            raise ValueError(f"reservations: {', '.join(twice)} named more than once")
        if self.reserved_gpus > self.total_gpus:
            raise ValueError(
                f"reservations hold {self.reserved_gpus} GPUs, more than the pool's "
                f"{self.total_gpus} (gpusPerNode {self.gpus_per_node} x maxNodes "
                f"{self.max_nodes})")
        domain = self.topology.nvlink_domain_gpus if self.topology else None
        # A domain is part of one node (8 of an 8-GPU server) or a whole number of nodes
        # (72 = 18 nodes x 4 GPUs on an NVL72): anything else cannot be wired.
        if domain and self.gpus_per_node % domain and domain % self.gpus_per_node:
            raise ValueError(
                f"topology.nvlinkDomainGpus ({domain}) must divide gpusPerNode "
                f"({self.gpus_per_node}) or be a multiple of it")
        return self

    @property
    def total_gpus(self) -> int:
        """Every GPU the pool can have: gpusPerNode x maxNodes."""
        return self.gpus_per_node * self.max_nodes

    @property
    def reserved_gpus(self) -> int:
        return sum(each.gpus for each in self.reservations)

    @property
    def shareable_gpus(self) -> int:
        """GPUs scaled models may share (and budgets may guarantee): total less reserved."""
        return self.total_gpus - self.reserved_gpus


class _Document(_Model):
    """What a GpuPool and a GpuBudget document share: the API version and a name."""

    api_version: Literal["scaler.io/v1alpha1"] = Field(description="Always scaler.io/v1alpha1.")
    metadata: FleetMetadata = Field(description="Its name and labels.")

    @property
    def name(self) -> str:
        return self.metadata.name


class GpuPool(_Document):
    """A GPU node pool (kind GpuPool): what a ScalePolicy's spec.nodePool.name refers to."""

    kind: Literal["GpuPool"] = Field(description="Always GpuPool.")
    spec: GpuPoolSpec = Field(description="The pool's GPUs, price, nodes and reservations.")


def _label_value(value: str | None, what: str) -> str | None:
    if value is not None and (len(value) > 63 or not _LABEL_VALUE.match(value)):
        raise ValueError(
            f"{what} {value!r} is not a valid label value (letters, digits, '-', '_' and "
            "'.', alphanumeric at both ends, at most 63 characters)")
    return value


class GpuBudgetSpec(_Model):
    """GPUs one tenant or cost centre is guaranteed and may hold, on one pool or all."""

    tenant: str | None = Field(
        default=None, description="The tenant it covers: policies whose metadata.labels."
        "tenant is this. Exactly one of tenant and costCenter.")
    cost_center: str | None = Field(
        default=None, description="The cost centre it covers: policies whose "
        "metadata.labels.cost-center is this. Exactly one of tenant and costCenter.")
    pool: str | None = Field(
        default=None, description="The GpuPool it applies to. None: the covered policies' "
        "GPUs on every pool together.")
    guaranteed_gpus: int = Field(
        default=0, ge=0, description="GPUs the covered models get when they ask, whoever "
        "else is asking; the sum over a pool's budgets must fit in its unreserved GPUs. "
        "0: no guarantee.")
    max_gpus: int = Field(
        ge=1, description="Most GPUs the covered models may hold together: the ceiling. "
        "Required, as a policy's budget.maxGpus.")
    borrow: bool = Field(
        default=True, description="May go beyond the guarantee (up to maxGpus) on capacity "
        "nobody is guaranteed and on other budgets' idle guarantees, given back when their "
        "owner asks. Off: the guarantee is also the ceiling.")

    @field_validator("pool")
    @classmethod
    def _pool(cls, value: str | None) -> str | None:
        return None if value is None else model._dns_name(value, "pool name")

    @field_validator("tenant", "cost_center")
    @classmethod
    def _owner(cls, value: str | None) -> str | None:
        return _label_value(value, "label value")

    @model_validator(mode="after")
    def _cross(self) -> GpuBudgetSpec:
        if (self.tenant is None) == (self.cost_center is None):
            raise ValueError("set exactly one of tenant and costCenter: the policies the "
                             "budget covers")
        if self.guaranteed_gpus > self.max_gpus:
            raise ValueError(f"guaranteedGpus ({self.guaranteed_gpus}) is above maxGpus "
                             f"({self.max_gpus})")
        if not self.borrow and self.max_gpus != self.guaranteed_gpus:
            raise ValueError(
                f"borrow is off, so the budget can never hold more than guaranteedGpus "
                f"({self.guaranteed_gpus}): set maxGpus to it, or borrow: true to allow up "
                f"to {self.max_gpus}")
        return self

    @property
    def owner(self) -> tuple[Literal["tenant", "cost-center"], str]:
        """Which label the budget matches and its value, e.g. ('tenant', 'search')."""
        if self.tenant is not None:
            return "tenant", self.tenant
        assert self.cost_center is not None  # one of the two, by _cross
        return "cost-center", self.cost_center


class GpuBudget(_Document):
    """A tenant's or cost centre's GPUs (kind GpuBudget): a guarantee and a ceiling."""

    kind: Literal["GpuBudget"] = Field(description="Always GpuBudget.")
    spec: GpuBudgetSpec = Field(description="Who it covers, where, and how many GPUs.")

    def covers(self, policy: model.ScalePolicy) -> bool:
        """Whether the policy's tenant or cost centre is this budget's (any pool)."""
        spec = self.spec
        if spec.tenant is not None:
            return policy.tenant == spec.tenant
        return policy.cost_center == spec.cost_center


@dataclass(frozen=True, slots=True)
class Fleet:
    """The pools and budgets in force, by name."""

    pools: Mapping[str, GpuPool] = field(default_factory=dict)
    budgets: Mapping[str, GpuBudget] = field(default_factory=dict)

    def pool_of(self, policy: model.ScalePolicy) -> GpuPool | None:
        """The GpuPool the policy's spec.nodePool names, None without one (or no such pool)."""
        node_pool = policy.spec.node_pool
        return None if node_pool is None else self.pools.get(node_pool.name)

    def budgets_of(self, policy: model.ScalePolicy) -> list[GpuBudget]:
        """The budgets that cover the policy: its tenant's and cost centre's, on its pool
        or on every pool, sorted by name."""
        pool = policy.spec.node_pool.name if policy.spec.node_pool else None
        return [budget for _, budget in sorted(self.budgets.items())
                if budget.covers(policy) and budget.spec.pool in (None, pool)]


def fleet_of(result: loader.LoadResult) -> Fleet:
    """The Fleet of a load: its valid pools and budgets by name."""
    return Fleet(pools={item.value.name: item.value for item in result.pools},
                 budgets={item.value.name: item.value for item in result.budgets})
