"""Settings: defaults, the YAML file, SCALER_ variables, and validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from scaler import cli
from scaler.core import backoff
from scaler.core import settings as core_settings
from scaler.service import runner, settings
from scaler.signals import connection
from tests import schema_fields


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
    path = tmp_path / "absent.yaml"
    with pytest.raises(core_settings.SettingsError) as caught:
        settings.load_settings(path, environ={})
    assert str(caught.value) == f"{path}: settings file does not exist"


def test_secrets_are_not_printed() -> None:
    loaded = settings.load_settings(environ={"SCALER_NATS__USER": "scaler",
                                             "SCALER_NATS__PASSWORD": "hunter2",
                                             "SCALER_HTTP__PUSH_TOKEN": "t0ken"})
    assert "hunter2" not in repr(loaded) and "t0ken" not in repr(loaded)
    assert loaded.nats.password is not None
    assert loaded.nats.password.get_secret_value() == "hunter2"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SCALER_HTTP__PORTT": "1"},
         "SCALER_HTTP__PORTT: http.portt: unknown setting (check the spelling; settings are "
         "snake_case)"),
        ({"SCALER_HTTP__PORT": "70000"},
         "SCALER_HTTP__PORT: http.port: Input should be less than or equal to 65535"),
        ({"SCALER_NATS__PASSWORD": "x"},
         "SCALER_NATS__PASSWORD: nats: user and password go together"),
        ({"SCALER_NATS__TOKEN": "t", "SCALER_NATS__USER": "u", "SCALER_NATS__PASSWORD": "p"},
         "SCALER_NATS__PASSWORD, SCALER_NATS__TOKEN, SCALER_NATS__USER: nats: use one NATS "
         "auth method: user/password, token, nkey or creds"),
        ({"SCALER_KUBE__LEASE__RENEW_DEADLINE_S": "20"},
         "SCALER_KUBE__LEASE__RENEW_DEADLINE_S: kube.lease: need retry_period_s < "
         "renew_deadline_s < lease_duration_s"),
        ({"SCALER_METRICS_API__CERT_FILE": "/tls.crt"},
         "SCALER_METRICS_API__CERT_FILE: metrics_api: cert_file and key_file go together"),
        ({"SCALER_NATS__TLS__KEY_FILE": "/k"},
         "SCALER_NATS__TLS__KEY_FILE: nats.tls: cert_file and key_file go together"),
        ({"SCALER_ENGINE__BACKSTOP_TICK_SECONDS": "0"},
         "SCALER_ENGINE__BACKSTOP_TICK_SECONDS: engine.backstop_tick_seconds: Input should "
         "be greater than 0"),
        ({"SCALER_LOG__LEVEL": "LOUD"},
         "SCALER_LOG__LEVEL: log.level: Input should be 'DEBUG', 'INFO', 'WARNING' or "
         "'ERROR'"),
        ({"SCALER_NATS__RECONNECT__JITTER_RATIO": "2"},
         "SCALER_NATS__RECONNECT__JITTER_RATIO: nats.reconnect.jitter_ratio: Input should "
         "be less than or equal to 1"),
        # The names before the backoff was shared: refused, not silently ignored.
        ({"SCALER_NATS__RECONNECT_BASE_S": "1"},
         "SCALER_NATS__RECONNECT_BASE_S: nats.reconnect_base_s: unknown setting (check the "
         "spelling; settings are snake_case)"),
        ({"SCALER_KUBE__RESOURCE_PLURALS": "llamas"},
         "SCALER_KUBE__RESOURCE_PLURALS: kube: not valid JSON (lists and mappings are read "
         "as JSON, except the comma-separated lists)"),
    ],
)
def test_invalid_variables_are_named_with_field_and_rule(
        environ: dict[str, str], expected: str) -> None:
    with pytest.raises(core_settings.SettingsError) as caught:
        settings.load_settings(environ=environ)
    assert str(caught.value) == expected


def test_every_problem_is_reported_once_each(tmp_path: Path) -> None:
    with pytest.raises(core_settings.SettingsError) as caught:
        settings.load_settings(environ={"SCALER_KUBE__RETRY__MAX_ATTEMPTS": "many",
                                        "SCALER_HTTP__PORT": "-1"})
    assert [(p.where, p.field) for p in caught.value.problems] == [
        ("SCALER_KUBE__RETRY__MAX_ATTEMPTS", "kube.retry.max_attempts"),
        ("SCALER_HTTP__PORT", "http.port")]


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("htpp: {port: 1}\n", {},
         "{path}: htpp: unknown setting (check the spelling; settings are snake_case)"),
        ("http: {port: 99999}\n", {},
         "{path}: http.port: Input should be less than or equal to 65535"),
        # The variable wins over the file, so the variable is what is wrong.
        ("http: {port: 9000}\n", {"SCALER_HTTP__PORT": "99999"},
         "SCALER_HTTP__PORT: http.port: Input should be less than or equal to 65535"),
        # A rule across fields names every place that set one of them.
        ("nats: {user: scaler}\n", {"SCALER_NATS__TOKEN": "t"},
         "{path}, SCALER_NATS__TOKEN: nats: use one NATS auth method: user/password, token, "
         "nkey or creds"),
        ("http: {port: 1\n", {},
         "{path}: invalid YAML: line 2, column 1: expected ',' or '}}', but got '<stream end>'"),
        ("- nats\n- http\n", {},
         "{path}: expected a mapping of settings groups (nats:, http:, ...)"),
    ],
)
def test_file_problems_name_the_file(
        tmp_path: Path, text: str, environ: dict[str, str], expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(core_settings.SettingsError) as caught:
        settings.load_settings(path, environ=environ)
    assert str(caught.value) == expected.format(path=path)


def test_a_partly_set_group_keeps_its_other_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "nats: {reconnect: {base_delay_s: 1.0}}\n")
    loaded = settings.load_settings(path, environ={"SCALER_KUBE__RETRY__MAX_ATTEMPTS": "2"})
    assert loaded.nats.reconnect == backoff.Backoff(base_delay_s=1.0)
    assert loaded.kube.retry.max_attempts == 2
    assert loaded.kube.retry.max_delay_s == backoff.Backoff().max_delay_s


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert settings.load_settings(write(tmp_path, ""), environ={}) == settings.load_settings(
        environ={})


def test_nats_group_is_the_sources_connection_settings() -> None:
    loaded = settings.load_settings(environ={"SCALER_NATS__SERVERS": "nats://x:1,nats://y:2",
                                             "SCALER_NATS__TLS__CA_FILE": "/ca.pem"})
    assert isinstance(loaded.nats, connection.NatsSettings)
    assert loaded.nats.servers == ("nats://x:1", "nats://y:2")
    assert loaded.nats.tls is not None and loaded.nats.tls.ca_file == Path("/ca.pem")


def _groups(model: type[BaseModel]) -> list[type[BaseModel]]:
    out = []
    for field in model.model_fields.values():
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += [arg, *_groups(arg)]
    return out


def test_every_group_derives_from_the_one_base() -> None:
    groups = _groups(settings.Settings)
    assert len(groups) >= 15
    assert [g.__name__ for g in groups if not issubclass(g, core_settings.Group)] == []


def test_cli_reports_invalid_settings_in_one_line_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "http: {port: 99999}\nlog: {level: LOUD}\n")
    assert cli.main(["run", "--settings", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"scaler run: invalid settings: {path}: http.port: Input should be less than or "
        "equal to 65535",
        f"scaler run: invalid settings: {path}: log.level: Input should be 'DEBUG', 'INFO', "
        "'WARNING' or 'ERROR'",
    ]


def test_the_settings_table_matches_the_schema() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    rows = schema_fields.table_rows(text, section="## Settings")
    assert len(rows) > 60
    assert schema_fields.check_table(rows, settings.schema_document()) == []


def test_an_explicit_environment_replaces_the_process_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALER_HTTP__PORT", "9999")
    assert settings.load_settings(environ={}).http.port == 8080
    assert settings.load_settings(environ={"SCALER_HTTP__PORT": "9000"}).http.port == 9000
    assert settings.load_settings().http.port == 9999  # the process environment
    assert settings.Settings().http.port == 8080  # the constructor is the pure defaults


def test_signal_limits_are_reachable_from_settings() -> None:
    loaded = settings.load_settings(environ={
        "SCALER_SIGNALS__MAX_SOURCES_PER_MODEL": "3", "SCALER_SIGNALS__MAX_FUTURE_S": "1",
        "SCALER_SIGNALS__RETAIN_SECONDS": "90"})
    assert loaded.signals.store_limits().max_sources == 3
    assert loaded.signals.store_limits().ttl_s == 90
    assert loaded.signals.message_limits().max_future_s == 1
    service = runner.Service(loaded)
    assert service.store.limits.max_sources == 3
