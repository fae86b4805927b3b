"""Typed settings of the Kubernetes adapters: client, retries, Lease, events, placeholders."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from scaler.core import backoff as core_backoff
from scaler.core import settings as core_settings


class RetrySettings(core_backoff.Backoff):
    """How transient API errors (429, 5xx, timeouts, dropped connections) are retried.

    The waits follow the backoff schedule (scaler.core.backoff): with its defaults retries
    wait 0.125-0.25, 0.25-0.5, 0.5-1, 1-2 s, so 5 attempts give up after 1.9 to 3.75 s.
    A 429's Retry-After replaces the computed delay, capped at `max_retry_after_s` so a bad
    header cannot stall a decision. 409 Conflict is never retried here: the caller re-reads
    and re-decides.
    """

    max_attempts: int = Field(
        default=5, ge=1, description="Attempts in total, the first included. 5: 2 to 4 s "
        "of retries, enough to ride out an API server restart's connection resets while "
        "a decision is still current.")
    max_retry_after_s: float = Field(
        default=30.0, gt=0, description="Cap on a 429's Retry-After, seconds, so a bad "
        "header cannot stall a decision for minutes. 30 s: the API server's priority and "
        "fairness asks for 1 s or a few.")


class LeaseSettings(core_settings.Group):
    """coordination.k8s.io/v1 Lease election, with client-go's default timings.

    The leader renews every `retry_period_s` (2 s); if it cannot renew for
    `renew_deadline_s` (10 s) it stops acting; others take over once they have seen the
    same lease unchanged for `lease_duration_s` (15 s). Because 10 < 15, the old leader has
    stopped writing 5 s before anyone else can start.
    """

    enabled: bool = Field(
        default=True, description="Elect a leader through the Lease, so only one of several "
        "scaler replicas patches. Off: act as leader alone (one replica only).")
    namespace: str = Field(
        default="default", description="Namespace of the Lease. The Helm chart sets the "
        "release namespace; 'default' is what exists in every cluster.")
    name: str = Field(default="scaler-leader",
                      description="Name of the Lease; replicas sharing it elect one leader.")
    lease_duration_s: int = Field(
        default=15, ge=1, description="Seconds a lease must stay unrenewed before others "
        "take over (whole seconds, as the Lease API stores it). 15 s: client-go's default.")
    renew_deadline_s: float = Field(
        default=10.0, gt=0, description="Seconds the leader keeps acting without a "
        "successful renewal, then stops. 10 s: client-go's default, 5 s inside the duration.")
    retry_period_s: float = Field(
        default=2.0, gt=0, description="Seconds between renewals (and between attempts to "
        "acquire). 2 s: client-go's default, five tries within the renew deadline.")

    @model_validator(mode="after")
    def _ordered(self) -> LeaseSettings:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")
        return self


class EventSettings(core_settings.Group):
    """Kubernetes Events on targets: a token bucket per object.

    burst 5, refill one per 60 s: a target flapping every 10 s gets 5 events, then one a
    minute; the rest are logged only. Same spirit as client-go's spam filter.
    """

    enabled: bool = Field(
        default=True, description="Post Kubernetes Events on targets (scaled, held, policy "
        "invalid), so `kubectl describe` shows why.")
    burst: int = Field(
        default=5, ge=1, description="Events a target may get at once (the token bucket's "
        "size). 5 tells a flap apart from one change without flooding etcd.")
    refill_seconds: float = Field(
        default=60.0, gt=0, description="Seconds per token refilled: one more Event allowed "
        "per minute after the burst; the rest are logged only.")
    component: str = Field(
        default="scaler", description="source.component of the Events (what `kubectl get "
        "events` shows as the reporter).")


class PlaceholderSettings(core_settings.Group):
    """The `placeholder` node-pool actuator's Deployment of pause pods.

    priority_class: must exist and have a value below every real workload (e.g. -10), so
    the scheduler preempts placeholders for real replicas; the Helm chart installs it.
    """

    enabled: bool = Field(
        default=False, description="Run the placeholder node-pool actuator, which creates "
        "and patches Deployments in `namespace` (and needs RBAC for that there only). Off: "
        "pools naming actuator `placeholder` are planned and reported, nothing is created; "
        "off by default so that the scaler may create no Deployment unless asked.")
    namespace: str = Field(
        default="scaler-system", description="Namespace of the placeholder Deployments; the "
        "Helm chart's default namespace, where the scaler runs.")
    priority_class: str = Field(
        default="scaler-placeholder", description="PriorityClass of placeholder pods; must "
        "be below every real workload so the scheduler preempts them. The chart installs it.")
    image: str = Field(
        default="registry.k8s.io/pause:3.10", description="Image of placeholder pods: the "
        "pause image, which does nothing and is cached on every node.")
    tolerations: tuple[dict[str, str], ...] = Field(
        default=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        description="Tolerations of placeholder pods when the policy's node pool gives "
        "none. Default: the nvidia.com/gpu taint that GPU node pools usually carry.")


class CapacityBufferSettings(core_settings.Group):
    """The `capacitybuffer` node-pool actuator: one CapacityBuffer (Cluster Autoscaler's
    autoscaling.x-k8s.io API) and the PodTemplate it references per pool, in `namespace`."""

    enabled: bool = Field(
        default=False, description="Run the capacitybuffer node-pool actuator, which creates "
        "and patches CapacityBuffers and PodTemplates in `namespace` (and needs RBAC for "
        "that there only). Off: pools naming actuator `capacitybuffer` are planned and "
        "reported, nothing is created.")
    namespace: str = Field(
        default="scaler-system", description="Namespace of the CapacityBuffers and their "
        "PodTemplates (a buffer references a PodTemplate of its own namespace only); the "
        "Helm chart's default namespace, where the scaler runs.")
    version: Literal["v1alpha1", "v1beta1"] = Field(
        default="v1alpha1", description="API version of autoscaling.x-k8s.io CapacityBuffers "
        "to write. v1alpha1: served by Cluster Autoscaler 1.34 and later (deprecated from "
        "1.35, which stores v1beta1); v1beta1 needs 1.35 or later.")


class DeletionCostSettings(core_settings.Group):
    """`controller.kubernetes.io/pod-deletion-cost` on a Deployment's pods, written before
    each scale-down from the work each pod reports (its `source` in the signal messages),
    so the ReplicaSet controller removes the idlest pods first (docs/kubernetes.md)."""

    enabled: bool = Field(
        default=True, description="Annotate the target's pods before a scale-down (and "
        "grant `patch` on pods for it). Off: the ReplicaSet controller picks the pods to "
        "remove by its own ranking alone; also the switch when another controller owns "
        "the annotation.")
    max_pods: int = Field(
        default=64, ge=1, description="Pods annotated at most before one scale-down, those "
        "whose cost changes most first (the rest keep their earlier value, and are caught "
        "up at the next scale-down). 64: 8 at a time, a few hundred ms on a healthy API "
        "server, small next to a 300 s down window; the whole step gives up after "
        "kube.request_timeout_s and the scale-down goes ahead.")


class LearnedStateSettings(core_settings.Group):
    """What the engine learned of each model (served share, load of a request, return
    pattern, start times), kept in a ConfigMap beside the Lease: the leader writes it, every
    instance reads it at start, so a restart or a failover does not forget it
    (docs/service.md)."""

    enabled: bool = Field(
        default=True, description="Keep the learned state in a ConfigMap (and grant get, "
        "create and update on ConfigMaps in the Lease's namespace). Off: every start learns "
        "from nothing.")
    name: str | None = Field(
        default=None, description="Name of the ConfigMap, in the Lease's namespace. None: "
        "the Lease's name + '-learned' (a dry-run instance's Lease has its own name, so its "
        "own ConfigMap).")
    write_seconds: float = Field(
        default=60.0, gt=0, description="The leader writes what changed this often (and at "
        "shutdown). 60 s: a failover loses at most a minute of learning; one small write a "
        "minute.")
    max_age_seconds: float = Field(
        default=86_400.0, gt=0, description="A record older than this is not resumed: the "
        "load it was learned on may be gone. One day: a daily cycle's pattern carries over, "
        "a week-old capacity share does not.")


class KubeSettings(core_settings.Group):
    """How the scaler reaches the Kubernetes API.

    host: a plain API URL (tests, `kubectl proxy`); else `kubeconfig` (+ `context`); else
    the in-cluster service account. Every call has `request_timeout_s`; watches ask the
    server to end after `watch_timeout_s` and are then resumed from the last version.
    """

    host: str | None = Field(
        default=None, description="Plain API URL without auth (tests, `kubectl proxy`). "
        "None: use kubeconfig, else the in-cluster service account.")
    kubeconfig: str | None = Field(
        default=None, description="Path of a kubeconfig file. None: the in-cluster service "
        "account, which is how the Helm chart runs it.")
    context: str | None = Field(
        default=None, description="Context in the kubeconfig. None: its current context.")
    request_timeout_s: float = Field(
        default=10.0, gt=0, description="Timeout of every API call, seconds. 10 s: a "
        "healthy API server answers in milliseconds; longer means it is in trouble.")
    watch_timeout_s: int = Field(
        default=300, ge=1, description="Seconds after which the server ends a watch (it is "
        "then resumed from the last resourceVersion). 300 s: below the API server's "
        "30-60 min limit, so a silently dead connection is replaced within 5 minutes.")
    dry_run: bool = Field(
        default=False, description="Decide and log what would be patched, patch nothing "
        "(`scaler run --dry-run`).")
    ownership_ttl_s: float = Field(
        default=30.0, ge=0, description="Seconds a 'no HPA or KEDA owns this target' answer "
        "is reused before the API is asked again; 30 s bounds the API calls to one per "
        "target per 30 s. 0: ask before every patch.")
    observation_window_s: float = Field(
        default=3600.0, gt=0, description="Seconds of observed pod start timelines kept for "
        "learning cold starts; older ones are dropped. One hour: recent enough to follow "
        "an image cache warming up.")
    watch_namespaces: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="Namespaces where targets are scaled and pods watched (a "
        "Role in each, `scaler kube rbac`); a policy elsewhere is refused with an error. "
        "Empty: the namespaces of the policies in force, each watched from its first "
        "policy on. The Helm chart sets the list it grants (default: its own namespace).")
    cluster_wide: bool = Field(
        default=False, description="One cluster-wide pod watch and targets in any "
        "namespace (ClusterRoles: `scaler kube rbac --cluster-wide`). Pool capacity then "
        "counts GPUs that pods of every namespace use on pool nodes; namespaced, only the "
        "watched namespaces' pods are seen. Off: least privilege, per namespace.")

    _split = field_validator("watch_namespaces", mode="before")(core_settings.split_commas)
    clusterapi_namespace: str = Field(
        default="default", description="Namespace of the Cluster API MachineDeployments "
        "that the clusterapi node-pool actuator scales.")
    resource_plurals: dict[str, str] = Field(
        default_factory=dict,
        description="Resource plural per 'Kind.group' where the English rule is wrong, e.g. "
        "{'Llama.example.com': 'llamas'}. Empty: the rule (deployments, policies, ...).",
    )
    retry: RetrySettings = Field(
        default_factory=RetrySettings,
        description="How transient API errors (429, 5xx, timeouts) are retried.")
    lease: LeaseSettings = Field(
        default_factory=LeaseSettings, description="Leader election through a Lease.")
    events: EventSettings = Field(
        default_factory=EventSettings, description="Kubernetes Events posted on targets.")
    placeholder: PlaceholderSettings = Field(
        default_factory=PlaceholderSettings,
        description="Pause pods that keep warm GPU nodes (the placeholder node-pool actuator).")
    capacitybuffer: CapacityBufferSettings = Field(
        default_factory=CapacityBufferSettings,
        description="CapacityBuffers that keep warm GPU nodes (the capacitybuffer node-pool "
        "actuator).")
    deletion_cost: DeletionCostSettings = Field(
        default_factory=DeletionCostSettings,
        description="Pod deletion costs from in-flight work before a scale-down.")
    learned_state: LearnedStateSettings = Field(
        default_factory=LearnedStateSettings,
        description="The engine's learned state kept across restarts, in a ConfigMap.")

    @model_validator(mode="after")
    def _one_scope(self) -> KubeSettings:
        if self.cluster_wide and self.watch_namespaces:
            raise ValueError("watch_namespaces and cluster_wide exclude each other: a list "
                             "of namespaces, or every namespace")
        return self
