"""Settings: defaults, the YAML file, SCALER_ variables, and validation."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
from pydantic import BaseModel

from scaler.service import settings
from scaler.signals import connection


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


def test_defaults_without_file_or_environment() -> None:
    loaded = settings.load_settings(environ={})
    assert loaded.nats.servers == ("nats://127.0.0.1:4222",)
    assert loaded.nats.subject_prefix == "scaler.signals"
    assert loaded.http.port == 8080
    assert loaded.metrics_api.port == 6443
    assert loaded.engine.backstop_tick_seconds == 5.0
    assert loaded.policies.paths == [Path("/etc/scaler/policies")]
    assert loaded.kube.lease.name == "scaler-leader"
    assert loaded.prometheus.url == "http://127.0.0.1:9090"
    assert loaded.audit.path is None


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, """
http: {port: 9000, host: 127.0.0.1}
nats: {servers: [nats://a:4222, nats://b:4222], subject_prefix: from-file}
kube: {lease: {namespace: locks}}
""")
    loaded = settings.load_settings(path, environ={
        "SCALER_HTTP__PORT": "9100",
        "SCALER_POLICIES__PATHS": "/etc/a, /etc/b",
        "SCALER_KUBE__DRY_RUN": "true",
        "SCALER_TEST_KUBECONFIG": "/belongs/to/the/tests",
    })
    assert loaded.http.port == 9100  # environment wins
    assert loaded.http.host == "127.0.0.1"  # the file fills what the environment does not
    assert loaded.nats.servers == ("nats://a:4222", "nats://b:4222")
    assert loaded.nats.subject_prefix == "from-file"
    assert loaded.policies.paths == [Path("/etc/a"), Path("/etc/b")]
    assert loaded.kube.dry_run is True
    assert loaded.kube.lease.namespace == "locks"


def test_settings_file_named_by_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "engine: {backstop_tick_seconds: 1.5}\n")
    loaded = settings.load_settings(environ={"SCALER_SETTINGS_FILE": str(path)})
    assert loaded.engine.backstop_tick_seconds == 1.5


def test_missing_settings_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        settings.load_settings(tmp_path / "absent.yaml", environ={})


def test_secrets_are_not_printed() -> None:
    loaded = settings.load_settings(environ={"SCALER_NATS__USER": "scaler",
                                             "SCALER_NATS__PASSWORD": "hunter2",
                                             "SCALER_HTTP__PUSH_TOKEN": "t0ken"})
    assert "hunter2" not in repr(loaded) and "t0ken" not in repr(loaded)
    assert loaded.nats.password is not None
    assert loaded.nats.password.get_secret_value() == "hunter2"


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"SCALER_HTTP__PORTT": "1"}, "portt"),
        ({"SCALER_HTTP__PORT": "70000"}, "less than or equal to 65535"),
        ({"SCALER_NATS__PASSWORD": "x"}, "user and password go together"),
        ({"SCALER_NATS__TOKEN": "t", "SCALER_NATS__USER": "u", "SCALER_NATS__PASSWORD": "p"},
         "one NATS auth method"),
        ({"SCALER_KUBE__LEASE__RENEW_DEADLINE_S": "20"}, "renew_deadline_s <"),
        ({"SCALER_METRICS_API__CERT_FILE": "/tls.crt"}, "go together"),
        ({"SCALER_NATS__TLS__KEY_FILE": "/k"}, "go together"),
        ({"SCALER_ENGINE__BACKSTOP_TICK_SECONDS": "0"}, "greater than 0"),
        ({"SCALER_LOG__LEVEL": "LOUD"}, "DEBUG"),
    ],
)
def test_invalid_settings_say_which(environ: dict[str, str], fragment: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=fragment):
        settings.load_settings(environ=environ)


def test_file_typos_are_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "htpp: {port: 1}\n")
    with pytest.raises(pydantic.ValidationError, match="htpp"):
        settings.load_settings(path, environ={})


def test_nats_group_is_the_sources_connection_settings() -> None:
    loaded = settings.load_settings(environ={"SCALER_NATS__SERVERS": "nats://x:1,nats://y:2",
                                             "SCALER_NATS__TLS__CA_FILE": "/ca.pem"})
    assert isinstance(loaded.nats, connection.NatsSettings)
    assert loaded.nats.servers == ("nats://x:1", "nats://y:2")
    assert loaded.nats.tls is not None and loaded.nats.tls.ca_file == Path("/ca.pem")


def _groups() -> list[tuple[str, type[BaseModel]]]:
    groups = []
    for name, field in settings.Settings.model_fields.items():
        annotation = field.annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel), name
        groups.append((name, annotation))
    return groups


@pytest.mark.parametrize(("group", "model"), _groups())
def test_every_field_is_documented(group: str, model: type[BaseModel]) -> None:
    # Fields declared here; groups reused from the signal sources and the Kubernetes
    # adapters document theirs in their own modules.
    assert model.__doc__, group
    if model.__module__ != settings.__name__:
        return
    for name, field in model.model_fields.items():
        if name in model.__annotations__:
            assert field.description and len(field.description) > 10, f"{group}.{name}"
