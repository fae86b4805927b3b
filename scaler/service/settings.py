"""Service settings: `SCALER_` environment variables over an optional YAML file over defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from scaler.actuators import settings as kube_settings
from scaler.core import schema as core_schema
from scaler.core import settings as core_settings
from scaler.policy import loader as policy_loader
from scaler.policy import shards as policy_shards
from scaler.service import tls
from scaler.signals import connection, messages, store
from scaler.signals import prometheus as prometheus_source

# `scaler run --settings PATH` wins; otherwise this variable names the file.
SETTINGS_FILE_ENV = "SCALER_SETTINGS_FILE"


class NatsSettings(connection.NatsSettings):
    """Where signals arrive (DESIGN 4.2): the signal sources' connection settings
    (servers, auth, TLS, reconnect backoff: see scaler.signals.connection) plus how the
    service subscribes."""

    servers: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("nats://127.0.0.1:4222",),
        description="NATS URLs, comma-separated in the environment. Default: a local server, "
        "which is what `scaler demo` and a sidecar deployment use.",
    )
    subject_prefix: str = Field(
        default="scaler.signals",
        description="Signals for a model arrive on <prefix>.<namespace>.<model> (DESIGN 4.2).",
    )
    wildcard: bool = Field(
        default=True,
        description="Subscribe once to <prefix>.> rather than once per model: one "
        "subscription whatever the number of models (1,000 models would otherwise be "
        "1,000 SUBs to replay on every reconnect).",
    )
    queue_group: str | None = Field(
        default=None,
        description="NATS queue group when several scaler replicas share signal load "
        "(DESIGN 7). None: every replica sees every message, so followers keep warm state.",
    )

    _split = field_validator("servers", mode="before")(core_settings.split_commas)


def tls_pair(cert_file: Path | None, key_file: Path | None) -> tls.CertificatePair | None:
    """The PEM pair a settings group names, None when it names none; one without the other
    is an error (both TLS-serving groups validate through this)."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together")
    if cert_file is None or key_file is None:
        return None
    return tls.CertificatePair(cert_file=cert_file, key_file=key_file)


class HttpSettings(core_settings.Group):
    """The plain HTTP port: /metrics, /healthz, /readyz, /v1/... (decisions, signal push)."""

    host: str = Field(
        default="0.0.0.0",
        description="Listen address. All interfaces, because Prometheus and kubelet probes "
        "reach the pod from outside.",
    )
    port: int = Field(
        default=8080, ge=0, le=65535,
        description="Listen port (0 = any free port, for tests).",
    )
    push_token: SecretStr | None = Field(
        default=None,
        description="Bearer token that HTTP signal pushes must carry. None disables the push "
        "endpoint: an unauthenticated write path into scaling decisions is never a default.",
    )
    push_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="Serve the push endpoint on its own port (0 = any free port), so a "
        "NetworkPolicy can admit publishers to push and scrapers to /metrics separately. "
        "None: push shares `port`.",
    )
    cert_file: Path | None = Field(
        default=None,
        description="PEM certificate for TLS on this port (and on push_port): the push token "
        "and /metrics then never travel in clear text. Goes with key_file. None: plain HTTP "
        "(keep the NetworkPolicy on, or a mesh with mTLS).",
    )
    key_file: Path | None = Field(
        default=None, description="PEM private key of cert_file. None: plain HTTP.")

    @model_validator(mode="after")
    def _pair(self) -> HttpSettings:
        tls_pair(self.cert_file, self.key_file)
        return self

    def tls_pair(self) -> tls.CertificatePair | None:
        return tls_pair(self.cert_file, self.key_file)


class MetricsApiSettings(core_settings.Group):
    """The external.metrics.k8s.io/v1beta1 API (DESIGN 4.3), served over TLS."""

    enabled: bool = Field(
        default=True, description="Serve the external metrics API, for teams whose HPA "
        "reads the scaler's signals. Off: no TLS port is opened.")
    host: str = Field(
        default="0.0.0.0", description="Listen address. All interfaces, because the "
        "kube-aggregator reaches the pod from outside.")
    port: int = Field(
        default=6443, ge=0, le=65535,
        description="TLS port. 6443 is what prometheus-adapter and KEDA's metrics server "
        "use, so existing APIService manifests fit (0 = any free port, for tests).",
    )
    cert_file: Path | None = Field(
        default=None, description="PEM certificate of the TLS port; goes with key_file. "
        "None: a self-signed pair is made at start (development only).")
    key_file: Path | None = Field(
        default=None, description="PEM private key of cert_file. None: self-signed, as above.")
    self_signed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1"],
        description="Names put in the self-signed certificate made when no cert/key is "
        "given (development only: the APIService then needs insecureSkipTLSVerify).",
    )

    authentication: bool = Field(
        default=True,
        description="Authenticate and authorise every caller but the probes as an "
        "aggregated API server does: front-proxy client certificates and CAs from "
        "kube-system/extension-apiserver-authentication, bearer tokens by TokenReview, "
        "access by SubjectAccessReview (docs/security.md). Applies when running against "
        "a cluster (a simulated one, as in `scaler demo`, has no API to ask). Off is "
        "INSECURE: anyone who reaches the port reads every model's metrics; for local "
        "development only.")

    _split = field_validator("self_signed_hosts", mode="before")(core_settings.split_commas)

    @model_validator(mode="after")
    def _pair(self) -> MetricsApiSettings:
        tls_pair(self.cert_file, self.key_file)
        return self

    def tls_pair(self) -> tls.CertificatePair | None:
        return tls_pair(self.cert_file, self.key_file)


class EngineSettings(core_settings.Group):
    """When the reactor evaluates models."""

    backstop_tick_seconds: float = Field(
        default=5.0, gt=0,
        description="Every model is also evaluated this often without new samples, for "
        "effects of time alone (windows expire, signals go stale). 5 s: with the default "
        "staleAfterSeconds of 30 s a silent source is noticed within 35 s.",
    )
    coalesce_seconds: float = Field(
        default=0.0, ge=0,
        description="After a sample arrives, wait this long for more before evaluating. "
        "0 = evaluate on the next loop iteration: samples already queued still coalesce "
        "into one evaluation, and publish-to-patch latency stays in milliseconds.",
    )


class ShardingSettings(core_settings.Group):
    """Several instances, each evaluating a share of the models (docs/scaling.md,
    "Sharding across instances"): arbitration domains (models linked by the pools and
    budgets they share) are hashed to shards, so every instance computes the same owner
    from the same files; a domain of more than `max_domain_models` models is split by
    model, its owner arbitrating for all of them. Each shard elects its own leader (the
    Lease name gets `-shard-<shard>`) and subscribes to its own models' subjects; shards
    exchange asks, grants and what the external metrics API serves over NATS under
    `subject_prefix`."""

    shards: int = Field(
        default=1, ge=1, le=1024,
        description="How many shards share the models. 1: one instance (with its "
        "followers) evaluates every model.")
    shard: int = Field(
        default=0, ge=0,
        description="Which shard this instance is, 0 .. shards - 1 (the Helm chart sets it "
        "per shard Deployment).")
    max_domain_models: int | None = Field(
        default=policy_shards.DEFAULT_MAX_DOMAIN_MODELS, ge=1,
        description="A domain with more models is split: each model is evaluated by the "
        "shard its own key hashes to among the others, and the domain's shard arbitrates "
        "every model's ask "
        "(a round trip over NATS). None: a domain is never split. 500: well under what one "
        "instance evaluates (docs/scaling.md), so a domain alone never fills a shard.")
    subject_prefix: str = Field(
        default="scaler.shards",
        description="Shards talk on <prefix>.decisions.<namespace>.<model> (what the "
        "external metrics API serves of a model, published by its shard's leader, so every "
        "instance answers for every model), <prefix>.asks.<shard> (asks of a split domain's "
        "models, to its arbiter) and <prefix>.grants.<shard> (the arbiter's grants back). "
        "Grant publish on it to the scaler's NATS user alone.")

    @model_validator(mode="after")
    def _in_range(self) -> ShardingSettings:
        if self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} is not below shards ({self.shards})")
        return self


class SignalLimitSettings(core_settings.Group):
    """How much of what arrives on the signal bus is believed and kept (bound at the edge).

    A model's own staleAfterSeconds is the age past which its messages are stale on
    arrival; these are the limits that hold whatever the policies say.
    """

    max_message_bytes: int = Field(
        default=64 * 1024, gt=0, le=64 * 1024,
        description="Largest message body accepted, in bytes. 64 KiB: the contract's limit "
        "(DESIGN 4.2); lower it to refuse more before parsing.")
    max_future_s: float = Field(
        default=5.0, ge=0,
        description="Seconds a message's ts may lie ahead of the scaler's clock (clock "
        "skew). 5 s: NTP-synced nodes are within milliseconds; minutes ahead is a bug.")
    default_max_age_s: float = Field(
        default=30.0, gt=0,
        description="Age past which a message is stale on arrival when its model is not "
        "known to the route (a model's policy sets its own). 30 s: the policies' default "
        "staleAfterSeconds.")
    max_sources_per_model: int = Field(
        default=4096, gt=0,
        description="Sources kept per model and signal; when full, a new source is refused "
        "and counted, never a known one evicted. 4,096 replicas is past any real model.")
    retain_seconds: float = Field(
        default=300.0, gt=0,
        description="Seconds a source's last value is kept after its timestamp (at least "
        "twice the longest staleAfterSeconds in force, whatever is set), so a stale value "
        "is reported as stale rather than missing, and a departed replica stops costing "
        "memory.")
    push_max_body_bytes: int = Field(
        default=1024 * 1024, gt=0,
        description="Largest HTTP push body, in bytes, enforced while reading. 1 MiB: about "
        "5,000 typical 200-byte messages.")
    push_max_items: int = Field(
        default=1000, gt=0, description="Most messages in one HTTP push request.")

    def message_limits(self) -> messages.Limits:
        return messages.Limits(max_bytes=self.max_message_bytes, max_future_s=self.max_future_s,
                               max_age_s=self.default_max_age_s)

    def store_limits(self) -> store.StoreLimits:
        return store.StoreLimits(ttl_s=self.retain_seconds,
                                 max_sources=self.max_sources_per_model)


class AuditSettings(core_settings.Group):
    """The audit log: one JSON line per decision, with its reasons."""

    path: Path | None = Field(
        default=None, description="JSONL file the decisions are appended to. None disables "
        "the log: the decisions are still in /v1/models/... and the service log.")
    max_bytes: int = Field(
        default=10 * 1024 * 1024, gt=0,
        description="Rotate when the file passes this size. 10 MiB holds about 5,000 "
        "decisions of ~2 KiB.",
    )
    backups: int = Field(
        default=5, ge=0, description="Rotated files kept (file.1 ... file.N); 60 MiB in all."
    )


class PolicySettings(core_settings.Group):
    """Where ScalePolicy files are and how often to look for changes."""

    paths: Annotated[list[Path], NoDecode] = Field(
        default_factory=lambda: [Path("/etc/scaler/policies")],
        description="Files or folders of ScalePolicy YAML (comma-separated in the "
        "environment). The default is where the Helm chart mounts its ConfigMap.",
    )
    reload_poll_seconds: float = Field(
        default=2.0, gt=0,
        description="How often files are checked for changes. Polling (not inotify) because "
        "a ConfigMap update is a symlink swap that inotify watches on the old file miss; "
        "2 s is small next to the kubelet's own ~60 s ConfigMap sync.",
    )
    max_file_bytes: int = Field(
        default=policy_loader.MAX_FILE_BYTES, gt=0,
        description="Largest policy file read, in bytes; a larger file is an error, refused "
        "before parsing (its policies in force stay). 1 MiB holds hundreds of policies of "
        "1-2 KiB each, while a 50 MB file took a minute and 580 MB of memory to parse.",
    )
    resources: bool = Field(
        default=False, description="Also read ScalePolicy resources (the "
        "scalepolicies.scaler.io CRD that the chart installs) in kube.watch_namespaces (all "
        "namespaces when empty), beside the files, and write their status as leader. A name "
        "or target both define is an error, as between two files. Off: files only, and no "
        "CRD or its RBAC is needed.",
    )
    status_min_interval_seconds: float = Field(
        default=10.0, gt=0, description="Least seconds between two status writes of one "
        "ScalePolicy resource, unless a condition changes (written at once). 10 s: a "
        "decision every 200 ms would otherwise mean 5 writes a second per model.",
    )

    _split = field_validator("paths", mode="before")(core_settings.split_commas)


class LogSettings(core_settings.Group):
    """The service's own log (decisions go to the audit log as well)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Root log level. INFO: one line per scaling action and "
        "per problem, not per sample."
    )
    format: Literal["json", "text"] = Field(
        default="json", description="json: one object per line, for log collectors (the "
        "default, since the service runs in a cluster); text: for a terminal."
    )


class Settings(core_settings.RootSettings):
    """All service settings. Environment: SCALER_<GROUP>__<FIELD>, e.g. SCALER_HTTP__PORT."""

    nats: NatsSettings = Field(
        default_factory=NatsSettings,
        description="Where signal messages arrive: NATS servers, auth, TLS, reconnects.")
    prometheus: prometheus_source.PrometheusSettings = Field(
        default_factory=prometheus_source.PrometheusSettings,
        description="The Prometheus server that policies with spec.sources.prometheus query.")
    kube: kube_settings.KubeSettings = Field(
        default_factory=kube_settings.KubeSettings,
        description="The Kubernetes API: client, retries, Lease, Events, placeholder pods.")
    http: HttpSettings = Field(
        default_factory=HttpSettings,
        description="The plain HTTP port: /metrics, health probes, decisions, signal push.")
    metrics_api: MetricsApiSettings = Field(
        default_factory=MetricsApiSettings,
        description="The external metrics API (external.metrics.k8s.io) for HPAs, over TLS.")
    engine: EngineSettings = Field(
        default_factory=EngineSettings,
        description="When models are evaluated: the backstop tick and sample coalescing.")
    signals: SignalLimitSettings = Field(
        default_factory=SignalLimitSettings,
        description="Bounds on what the signal sources accept and the store keeps.")
    audit: AuditSettings = Field(
        default_factory=AuditSettings,
        description="The JSONL audit log of every decision with its reasons.")
    policies: PolicySettings = Field(
        default_factory=PolicySettings,
        description="Where ScalePolicy files are and how often they are checked for changes.")
    log: LogSettings = Field(
        default_factory=LogSettings, description="The service's own log: level and format.")
    sharding: ShardingSettings = Field(
        default_factory=ShardingSettings,
        description="Several instances, each evaluating a share of the models.")


def load_settings(
    path: Path | None = None, *, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from `path` (or $SCALER_SETTINGS_FILE) and the environment.

    `environ` replaces os.environ (tests pass their own mapping instead of mutating it).
    A missing file named explicitly is an error, not silently the defaults. Raises
    SettingsError, whose lines name the file or variable, the field and what is allowed.
    """
    env = os.environ if environ is None else environ
    if path is None and env.get(SETTINGS_FILE_ENV):
        path = Path(env[SETTINGS_FILE_ENV])
    return core_settings.load(Settings, path=path, environ=env)


def schema_document() -> dict[str, Any]:
    """The JSON Schema of the settings file (snake_case keys, as in the YAML file)."""
    return core_schema.document(Settings, title="Settings", by_alias=False)
