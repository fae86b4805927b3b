"""Service settings: `SCALER_` environment variables over an optional YAML file over defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from scaler.actuators import settings as kube_settings
from scaler.signals import connection
from scaler.signals import prometheus as prometheus_source

ENV_PREFIX = "SCALER_"
# `scaler run --settings PATH` wins; otherwise this variable names the file.
SETTINGS_FILE_ENV = "SCALER_SETTINGS_FILE"


def _split_commas(value: Any) -> Any:
    """'a,b' -> ['a', 'b'] so list settings read naturally from one environment variable."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class _Group(BaseModel):
    """Base of the nested groups: unknown keys are typos, so they are errors; immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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

    _split = field_validator("servers", mode="before")(_split_commas)


class HttpSettings(_Group):
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


class MetricsApiSettings(_Group):
    """The external.metrics.k8s.io/v1beta1 API (DESIGN 4.3), served over TLS."""

    enabled: bool = Field(default=True, description="Serve the external metrics API.")
    host: str = Field(default="0.0.0.0", description="Listen address.")
    port: int = Field(
        default=6443, ge=0, le=65535,
        description="TLS port. 6443 is what prometheus-adapter and KEDA's metrics server "
        "use, so existing APIService manifests fit (0 = any free port, for tests).",
    )
    cert_file: Path | None = Field(default=None, description="PEM certificate.")
    key_file: Path | None = Field(default=None, description="PEM private key.")
    self_signed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1"],
        description="Names put in the self-signed certificate made when no cert/key is "
        "given (development only: the APIService then needs insecureSkipTLSVerify).",
    )

    _split = field_validator("self_signed_hosts", mode="before")(_split_commas)

    @model_validator(mode="after")
    def _pair(self) -> MetricsApiSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("metrics_api.cert_file and metrics_api.key_file go together")
        return self


class EngineSettings(_Group):
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


class AuditSettings(_Group):
    """The audit log: one JSON line per decision, with its reasons."""

    path: Path | None = Field(default=None, description="JSONL file; None disables the log.")
    max_bytes: int = Field(
        default=10 * 1024 * 1024, gt=0,
        description="Rotate when the file passes this size. 10 MiB holds about 5,000 "
        "decisions of ~2 KiB.",
    )
    backups: int = Field(
        default=5, ge=0, description="Rotated files kept (file.1 ... file.N); 60 MiB in all."
    )


class PolicySettings(_Group):
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

    _split = field_validator("paths", mode="before")(_split_commas)


class LogSettings(_Group):
    """The service's own log (decisions go to the audit log as well)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Root log level."
    )
    format: Literal["json", "text"] = Field(
        default="json", description="json: one object per line, for log collectors."
    )


class Settings(BaseSettings):
    """All service settings. Environment: SCALER_<GROUP>__<FIELD>, e.g. SCALER_HTTP__PORT."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    nats: NatsSettings = Field(default_factory=NatsSettings)
    prometheus: prometheus_source.PrometheusSettings = Field(
        default_factory=prometheus_source.PrometheusSettings)
    kube: kube_settings.KubeSettings = Field(default_factory=kube_settings.KubeSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    metrics_api: MetricsApiSettings = Field(default_factory=MetricsApiSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    policies: PolicySettings = Field(default_factory=PolicySettings)
    log: LogSettings = Field(default_factory=LogSettings)


def load_settings(
    path: Path | None = None, *, environ: dict[str, str] | None = None
) -> Settings:
    """Settings from `path` (or $SCALER_SETTINGS_FILE) and the environment.

    `environ` replaces os.environ (tests pass their own mapping instead of mutating it).
    A missing file named explicitly is an error, not silently the defaults.
    """
    env = os.environ if environ is None else environ
    if path is None and env.get(SETTINGS_FILE_ENV):
        path = Path(env[SETTINGS_FILE_ENV])
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"settings file {path} does not exist")
    yaml_path = path

    class _Loaded(Settings):
        model_config = SettingsConfigDict(title="Settings")

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            # Arguments beat the environment, which beats the file: an operator can override
            # one value of a mounted settings file with one variable.
            sources = [init_settings]
            if environ is None:
                sources.append(env_settings)
            if yaml_path is not None:
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_path))
            return tuple(sources)

    # An explicit mapping enters as init arguments, exploded like the environment would be.
    loaded: Settings = _Loaded(**({} if environ is None else _explode_env(environ)))
    return loaded


def _explode_env(environ: dict[str, str]) -> dict[str, Any]:
    """Nested dict from SCALER_GROUP__FIELD keys, for an explicit environment mapping."""
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or key == SETTINGS_FILE_ENV:
            continue
        parts = key[len(ENV_PREFIX):].lower().split("__")
        if parts[0] not in Settings.model_fields:
            continue  # e.g. SCALER_TEST_KUBECONFIG belongs to the tests, not to the service
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out
