"""Typed settings of the Kubernetes adapters: client, retries, Lease, events, placeholders."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetrySettings(_Settings):
    """How transient API errors (429, 5xx, timeouts, dropped connections) are retried.

    Delay before retry n (1-based) is `min(max_delay_s, base_delay_s * 2**(n-1))`, spread by
    +-jitter_ratio: with 0.2 s, 5 s and 0.2, retries wait about 0.2, 0.4, 0.8, 1.6 s (each
    +-20 %), so 5 attempts give up after roughly 3 s. A 429's Retry-After replaces the
    computed delay, capped at `max_retry_after_s` so a bad header cannot stall a decision.
    409 Conflict is never retried here: the caller re-reads and re-decides.
    """

    max_attempts: int = Field(default=5, ge=1, description="attempts in total, first included")
    base_delay_s: float = Field(default=0.2, gt=0, description="first retry delay, s")
    max_delay_s: float = Field(default=5.0, gt=0, description="longest retry delay, s")
    jitter_ratio: float = Field(default=0.2, ge=0, lt=1,
                                description="+- share of random spread on each delay")
    max_retry_after_s: float = Field(default=30.0, gt=0,
                                     description="cap on a 429's Retry-After, s")

    def backoff(self, attempt: int, random_unit: float) -> float:
        """Delay after failed attempt `attempt` (1-based); `random_unit` is in [0, 1)."""
        delay = min(self.max_delay_s, self.base_delay_s * 2.0 ** (attempt - 1))
        return float(delay * (1 + self.jitter_ratio * (2 * random_unit - 1)))


class LeaseSettings(_Settings):
    """coordination.k8s.io/v1 Lease election, with client-go's default timings.

    The leader renews every `retry_period_s` (2 s); if it cannot renew for
    `renew_deadline_s` (10 s) it stops acting; others take over once they have seen the
    same lease unchanged for `lease_duration_s` (15 s). Because 10 < 15, the old leader has
    stopped writing 5 s before anyone else can start.
    """

    enabled: bool = Field(default=True, description="off: act as leader alone (one replica)")
    namespace: str = Field(default="default", description="namespace of the Lease")
    name: str = Field(default="scaler-leader", description="name of the Lease")
    lease_duration_s: int = Field(default=15, ge=1,
                                  description="others take over after this long unrenewed, s")
    renew_deadline_s: float = Field(default=10.0, gt=0,
                                    description="the leader stops acting if unrenewed this long, s")
    retry_period_s: float = Field(default=2.0, gt=0, description="renew interval, s")

    @model_validator(mode="after")
    def _ordered(self) -> LeaseSettings:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")
        return self


class EventSettings(_Settings):
    """Kubernetes Events on targets: a token bucket per object.

    burst 5, refill one per 60 s: a target flapping every 10 s gets 5 events, then one a
    minute; the rest are logged only. Same spirit as client-go's spam filter.
    """

    enabled: bool = Field(default=True, description="post Events on targets")
    burst: int = Field(default=5, ge=1, description="Events a target may get at once")
    refill_seconds: float = Field(default=60.0, gt=0,
                                  description="one more Event allowed per this many s")
    component: str = Field(default="scaler", description="Event source component")


class PlaceholderSettings(_Settings):
    """The `placeholder` node-pool actuator's Deployment of pause pods.

    priority_class: must exist and have a value below every real workload (e.g. -10), so
    the scheduler preempts placeholders for real replicas; the Helm chart installs it.
    """

    namespace: str = Field(default="scaler-system",
                           description="namespace of the placeholder Deployments")
    priority_class: str = Field(default="scaler-placeholder",
                                description="PriorityClass below every real workload")
    image: str = Field(default="registry.k8s.io/pause:3.10", description="placeholder image")
    tolerations: tuple[dict[str, str], ...] = (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    )


class KubeSettings(_Settings):
    """How the scaler reaches the Kubernetes API.

    host: a plain API URL (tests, `kubectl proxy`); else `kubeconfig` (+ `context`); else
    the in-cluster service account. Every call has `request_timeout_s`; watches ask the
    server to end after `watch_timeout_s` and are then resumed from the last version.
    """

    host: str | None = Field(default=None, description="plain API URL (tests, kubectl proxy)")
    kubeconfig: str | None = Field(default=None, description="kubeconfig path; else in-cluster")
    context: str | None = Field(default=None, description="kubeconfig context")
    request_timeout_s: float = Field(default=10.0, gt=0, description="timeout of every call, s")
    watch_timeout_s: int = Field(default=300, ge=1,
                                 description="the server ends a watch after this; resumed, s")
    dry_run: bool = Field(default=False, description="compute and log, patch nothing")
    ownership_ttl_s: float = Field(
        default=30.0, ge=0, description="how long a 'no HPA/KEDA owns it' answer is reused")
    observation_window_s: float = Field(
        default=3600.0, gt=0, description="pod start timelines older than this are dropped")
    clusterapi_namespace: str = Field(default="default",
                                      description="namespace of the MachineDeployments")
    resource_plurals: dict[str, str] = Field(
        default_factory=dict,
        description="plural per 'Kind.group' where the English rule is wrong, e.g. "
        "{'Llama.example.com': 'llamas'}",
    )
    retry: RetrySettings = Field(default_factory=RetrySettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    events: EventSettings = Field(default_factory=EventSettings)
    placeholder: PlaceholderSettings = Field(default_factory=PlaceholderSettings)
