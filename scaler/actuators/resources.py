"""API paths of the objects the scaler touches, derived from a policy's target (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scaler.policy import model


def plural_of(kind: str) -> str:
    """The resource plural the API uses for a kind, by the rule CRDs almost always follow.

    Deployment -> deployments, LeaderWorkerSet -> leaderworkersets, Policy -> policies,
    Ingress -> ingresses. Kinds that break the rule go in `KubeSettings.resource_plurals`.
    """
    lower = kind.lower()
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "i", "o", "u"):
        return lower[:-1] + "ies"
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    return lower + "s"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One namespaced object of any kind, and the URLs to reach it."""

    api_version: str
    kind: str
    plural: str
    namespace: str
    name: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def collection(self) -> str:
        root = f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"
        return f"{root}/namespaces/{self.namespace}/{self.plural}"

    @property
    def path(self) -> str:
        return f"{self.collection}/{self.name}"

    @property
    def scale_path(self) -> str:
        return f"{self.path}/scale"

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    def involved_object(self, uid: str | None = None) -> dict[str, str]:
        """The `involvedObject` of an Event about this object."""
        ref = {"apiVersion": self.api_version, "kind": self.kind,
               "namespace": self.namespace, "name": self.name}
        if uid:
            ref["uid"] = uid
        return ref


def target_plural(target: model.Target, *, plurals: Mapping[str, str] | None = None) -> str:
    """The resource plural of a target; `plurals` overrides by 'Kind.group' (or 'Kind')."""
    overrides = plurals or {}
    return (overrides.get(f"{target.kind}.{target.group}") or overrides.get(target.kind)
            or plural_of(target.kind))


def target_ref(policy: model.ScalePolicy, *, plurals: Mapping[str, str] | None = None
               ) -> ObjectRef:
    """The object a policy scales; `plurals` overrides by 'Kind.group' (or 'Kind')."""
    target = policy.spec.target
    plural = target_plural(target, plurals=plurals)
    return ObjectRef(api_version=target.api_version, kind=target.kind, plural=plural,
                     namespace=policy.metadata.namespace, name=target.name)


def same_target(ref: ObjectRef, scale_target_ref: Mapping[str, object]) -> bool:
    """Whether an HPA's or ScaledObject's `scaleTargetRef` names this object.

    Group is compared, not version: an HPA naming apps/v1beta1 still owns the apps/v1
    Deployment. ScaledObjects default kind to Deployment and apiVersion to apps/v1.
    """
    kind = str(scale_target_ref.get("kind") or "Deployment")
    api_version = str(scale_target_ref.get("apiVersion") or "apps/v1")
    return (
        str(scale_target_ref.get("name")) == ref.name
        and kind == ref.kind
        and api_version.rpartition("/")[0] == ref.group
    )
