"""The chart's dashboard, ServiceMonitor and alerts: rendered with real Helm, every PromQL
expression checked by promtool and every metric it names found in a running service's
/metrics; and the metrics' hygiene (help text, closed label sets)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import aiohttp
import kubernetes_validate
import pydantic
import pytest
import yaml
from prometheus_client import parser as prom_parser
from prometheus_client.metrics_core import Metric

from scaler.actuators import base as actuators
from scaler.core import backoff as core_backoff
from scaler.engine import types
from scaler.policy import loader
from scaler.service import learned, runner, settings
from scaler.signals import messages
from scaler.testing import nats_server
from tests.service import fakes
from tests.service import test_end_to_end as e2e

from . import test_chart

ALL_ON = {"monitoring": {"serviceMonitor": {"enabled": True},
                         "prometheusRule": {"enabled": True},
                         "dashboard": {"enabled": True, "folder": "Inference"}}}
MONITORING = "monitoring.coreos.com/v1"

# -- PromQL: the metric names an expression reads -----------------------------------------

# Grafana's variables, replaced by values PromQL accepts so promtool can parse the query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "6h", "$__interval": "15s",
                     "$namespace": "inference", "$model": "llama-70b"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right",
                       "bool", "offset", "and", "or", "unless", "atan2", "inf", "nan"})
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers left once strings, label
    matchers ({...}), ranges ([...]) and grouping label lists are cut, that are not a
    function or aggregation (followed by '(') nor a keyword."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end():].lstrip()
        if match.group() not in _KEYWORDS and not rest.startswith("("):
            names.add(match.group())
    return names


def matchers(expr: str) -> list[tuple[str, str, str, str]]:
    """(metric, label, operator, value) of every label matcher on a named metric."""
    return [(metric, *matcher)
            for metric, block in re.findall(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr)
            for matcher in _MATCHER.findall(block)]


def test_the_tokenizer_skips_functions_labels_ranges_and_keywords() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, job) (rate(a_bucket{x="y(z)", w=~"b|c"}'
            '[$__rate_interval]))) / on (pod) group_left (node) b_total offset 5m '
            '> bool 1e3 or vector(0) and c:recorded unless d{e!="f"}[5m:1m]')
    assert metric_names(expr) == {"a_bucket", "b_total", "c:recorded", "d"}
    assert matchers(expr) == [("a_bucket", "x", "=", "y(z)"), ("a_bucket", "w", "=~", "b|c"),
                              ("d", "e", "!=", "f")]


# -- what the chart renders -----------------------------------------------------------------

def rendered_monitoring(values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    rendered = test_chart.render(values if values is not None else ALL_ON)
    return {name: objects for name, objects in rendered.items()
            if objects and name in ("servicemonitor.yaml", "prometheusrule.yaml",
                                    "dashboard-configmap.yaml")}


def rules(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    (rule,) = rendered["prometheusrule.yaml"]
    return [each for group in rule["spec"]["groups"] for each in group["rules"]]


def dashboard(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (config_map,) = rendered["dashboard-configmap.yaml"]
    (text,) = config_map["data"].values()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL query: panel targets, and the series selector of each variable's
    label_values(SELECTOR, LABEL) (a Grafana function, not PromQL)."""
    queries = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"]["query"])
            assert found, variable
            queries.append(found.group(1))
    return queries


def all_expressions(rendered: dict[str, list[dict[str, Any]]]) -> list[str]:
    return [r["expr"] for r in rules(rendered)] + dashboard_queries(dashboard(rendered))


def test_off_by_default_and_each_flag_alone() -> None:
    assert rendered_monitoring({}) == {}
    for flag, template in (("serviceMonitor", "servicemonitor.yaml"),
                           ("prometheusRule", "prometheusrule.yaml"),
                           ("dashboard", "dashboard-configmap.yaml")):
        assert list(rendered_monitoring({"monitoring": {flag: {"enabled": True}}})) == [
            template]


# The parts of the Prometheus Operator's CRD schemas (monitoring.coreos.com/v1) the chart
# uses, closed (extra fields forbidden): a misspelt field fails here, where the API
# server's structural schema would prune it silently.
Duration = Annotated[str, pydantic.StringConstraints(
    min_length=1, pattern=r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                          r"(([0-9]+)s)?(([0-9]+)ms)?)$")]
Text = Annotated[str, pydantic.StringConstraints(min_length=1)]


class _Closed(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)


class Endpoint(_Closed):
    port: str
    path: str = "/metrics"
    scheme: Literal["http", "https"] = "http"
    interval: Duration | None = None
    scrapeTimeout: Duration | None = None  # the CRD's field names
    honorLabels: bool = False
    tlsConfig: dict[str, Any] | None = None


class Selector(_Closed):
    matchLabels: dict[str, str]


class NamespaceSelector(_Closed):
    matchNames: list[str]


class MonitorSpec(_Closed):
    selector: Selector
    namespaceSelector: NamespaceSelector | None = None
    endpoints: list[Endpoint] | None = pydantic.Field(default=None, min_length=1)
    podMetricsEndpoints: list[Endpoint] | None = pydantic.Field(
        default=None, min_length=1)


class AlertLabels(pydantic.BaseModel):
    severity: Literal["critical", "warning", "info"]


class Annotations(_Closed):
    summary: Text
    description: Text
    runbook_url: Text


class Alert(_Closed):
    alert: Annotated[str, pydantic.StringConstraints(pattern="^[A-Z][A-Za-z]+$")]
    expr: Text
    for_: Duration = pydantic.Field(alias="for")
    labels: AlertLabels
    annotations: Annotations


class RuleGroup(_Closed):
    name: Text
    interval: Duration | None = None
    rules: list[Alert] = pydantic.Field(min_length=1)


class RuleSpec(_Closed):
    groups: list[RuleGroup] = pydantic.Field(min_length=1)


SPEC_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "ServiceMonitor": MonitorSpec, "PodMonitor": MonitorSpec, "PrometheusRule": RuleSpec}


def validate(obj: dict[str, Any], kube_version: str) -> None:
    if obj["apiVersion"] != MONITORING:
        kubernetes_validate.validate(obj, kube_version, strict=True)
        return
    # A CRD object's metadata is an ObjectMeta like any other: check it as a ConfigMap's.
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": obj["metadata"]}, kube_version, strict=True)
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    SPEC_MODELS[obj["kind"]].model_validate(obj["spec"])


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_manifests_match_their_schemas(kind: str) -> None:
    values = json.loads(json.dumps(ALL_ON))
    values["monitoring"]["serviceMonitor"]["kind"] = kind
    rendered = rendered_monitoring(values)
    objects = test_chart.all_objects(rendered)
    assert sorted(o["kind"] for o in objects) == sorted([kind, "PrometheusRule", "ConfigMap"])
    for obj in objects:
        for kube_version in test_chart.KUBE_VERSIONS:
            validate(obj, kube_version)
    (monitor,) = rendered["servicemonitor.yaml"]
    # It selects the chart's own Service / pods and scrapes the port named in them.
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "scaler", "app.kubernetes.io/instance": "scaler"}
    (endpoint,) = monitor["spec"]["endpoints" if kind == "ServiceMonitor"
                                  else "podMetricsEndpoints"]
    assert endpoint["port"] == "http" and endpoint["scheme"] == "http"
    (config_map,) = rendered["dashboard-configmap.yaml"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Inference"}
    with pytest.raises(pydantic.ValidationError):  # the schema does refuse a typo
        SPEC_MODELS[kind].model_validate({**monitor["spec"], "endpoint": []})


def test_a_wrong_monitor_kind_is_refused_by_name() -> None:
    with pytest.raises(Exception, match="monitoring.serviceMonitor.kind"):
        test_chart.render({"monitoring": {"serviceMonitor": {"enabled": True,
                                                            "kind": "Probe"}}})


def test_https_port_is_scraped_over_https() -> None:
    rendered = rendered_monitoring({"settings": {"http": {
        "cert_file": "/tls/http/tls.crt", "key_file": "/tls/http/tls.key"}},
        "monitoring": {"serviceMonitor": {"enabled": True, "tlsConfig": {
            "serverName": "scaler.scaler-system.svc"}}}})
    (monitor,) = rendered["servicemonitor.yaml"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"serverName": "scaler.scaler-system.svc"}


def test_alerts_cover_the_issue_list_and_have_runbook_sections() -> None:
    alerts = {r["alert"]: r for r in rules(rendered_monitoring())}
    assert {"ScalerSignalsStale", "ScalerModelAtMax", "ScalerScaleConflicts",
            "ScalerEvaluationErrors", "ScalerNoLeader", "ScalerLeaderFlapping"} <= set(alerts)
    runbook = (test_chart.REPO / "docs" / "kubernetes.md").read_text()
    headings = {line[4:].strip() for line in runbook.splitlines() if line.startswith("### ")}
    for name, rule in alerts.items():
        assert name in headings, f"docs/kubernetes.md has no '### {name}' runbook section"
        assert rule["annotations"]["runbook_url"].endswith("#" + name.lower())
    # Thresholds come from the values.
    custom = rendered_monitoring({"monitoring": {"prometheusRule": {
        "enabled": True, "noLeaderFor": "7m", "conflictsPerHour": 9}}})
    changed = {r["alert"]: r for r in rules(custom)}
    assert changed["ScalerNoLeader"]["for"] == "7m"
    assert changed["ScalerScaleConflicts"]["expr"].endswith(">= 9")


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (Debian's prometheus "
                    "package; scripts/test installs it when run as root, as in CI)")
def test_promtool_accepts_the_rules_and_every_dashboard_query(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    rendered = rendered_monitoring()
    (rule,) = rendered["prometheusrule.yaml"]
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]))
    # The dashboard's queries, parsed by Prometheus's own parser as recording rules.
    queries = dashboard_queries(dashboard(rendered))
    for variable, value in GRAFANA_VARIABLES.items():
        queries = [q.replace(variable, value) for q in queries]
    assert not [q for q in queries if "$" in q], "a Grafana variable promtool cannot parse"
    queries_file = tmp_path / "dashboard.yaml"
    queries_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{index}", "expr": q} for index, q in enumerate(queries)]}]}))
    for path in (rules_file, queries_file):
        checked = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                                 text=True, timeout=30, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"alert": "X", "expr": "sum by (model (scaler_ready)"}]}]}))
    refused = subprocess.run([PROMTOOL, "check", "rules", str(broken)], capture_output=True,
                             text=True, timeout=30, check=False)
    assert refused.returncode != 0  # promtool does parse the expressions


# -- the running service is the truth ------------------------------------------------------

def exported(text: str) -> dict[str, Metric]:
    """Every series name a scrape of this text can be queried by, to its family."""
    names: dict[str, Metric] = {}
    for family in prom_parser.text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"],
                    "summary": ["", "_count", "_sum"]}.get(family.type, [""])
        names.update({family.name + suffix: family for suffix in suffixes})
        names.update({sample.name: family for sample in family.samples})
    return names


INVALID_POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {name: broken, namespace: inference}
spec:
  target: {name: broken}
  replicaz: {min: 1, max: 2}
"""


async def scrape_running_service(tmp_path: Path) -> str:
    """/metrics of a real service (fake cluster, real nats-server) after a scale-up, with one
    valid policy, one invalid document, one file of broken YAML, one unreadable file and
    a second definition of the valid policy; one stale message is dropped."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "llama.yaml").write_text(e2e.policy_text())
    (policies / "broken.yaml").write_text(INVALID_POLICY)
    (policies / "typo.yaml").write_text("spec: [unclosed\n")
    (policies / "binary.yaml").write_bytes(b"\xff\xfe not text")
    (policies / "zcopy.yaml").write_text(e2e.policy_text())  # loads after llama.yaml
    cluster = fakes.FakeCluster(current=2)
    server = nats_server.NatsServer(jetstream=False)
    server.start()
    service: runner.Service | None = None
    try:
        config = settings.load_settings(environ={}).model_copy(update={
            "nats": settings.NatsSettings(servers=(server.url,),
                                          reconnect=core_backoff.Backoff(base_delay_s=0.05)),
            "http": settings.HttpSettings(host="127.0.0.1", port=0),
            "metrics_api": settings.MetricsApiSettings(enabled=False),
            "engine": settings.EngineSettings(coalesce_seconds=0.05),
            "policies": settings.PolicySettings(paths=[policies]),
        })
        service = runner.Service(config, backend=runner.ClusterBackend(
            reader=cluster, actuator=cluster, leader=actuators.AlwaysLeader()))
        await service.start()
        await asyncio.wait_for(service.wait_sources_ready(), timeout=10)
        await e2e.eventually(lambda: service is not None and service.state.ready, what="ready")
        await e2e.publish(server.url, e2e.burst(sources=30, in_flight=5.2))
        await e2e.eventually(lambda: cluster.current.get(e2e.KEY) == 15, what="scaled")
        await e2e.publish(server.url, e2e.burst(sources=1, in_flight=1.0, age_s=600.0))
        await e2e.eventually(lambda: service is not None and bool(service.state.dropped()),
                             what="a stale message dropped")
        assert service.http is not None
        async with aiohttp.ClientSession() as http, http.get(
                service.http.url + "/metrics") as response:
            assert response.status == 200
            return await response.text()
    finally:
        if service is not None:
            await service.stop()
        server.close()


# Labels whose values come from a closed set in the code, and that set.
CLOSED_LABELS: dict[str, frozenset[str]] = {
    "reason@scaler_policy_invalid": frozenset(loader.REASONS),
    "clamp": frozenset(types.ClampName),
    "outcome@scaler_patches_total": frozenset(actuators.Outcome) | {"read_failed"},
    "outcome@scaler_decisions_total": frozenset({"up", "down", "hold", "held"}),
    "horizon": frozenset({"now", "ready"}),
    "reason@scaler_dropped_messages_total": frozenset(messages.DropReason),
    "reason@scaler_signals_refused_total": frozenset(messages.DropReason),
    "result": frozenset({"ok", "invalid"}),
    "outcome@scaler_learned_state_writes_total": frozenset(learned.WRITE_OUTCOMES),
    "outcome@scaler_learned_state_records_total": frozenset(learned.RECORD_OUTCOMES),
}


def closed_set(label: str, metric: str) -> frozenset[str] | None:
    return CLOSED_LABELS.get(f"{label}@{metric}", CLOSED_LABELS.get(label))


async def test_every_metric_named_is_exported_and_the_metrics_are_clean(
        tmp_path: Path) -> None:
    text = await scrape_running_service(tmp_path)
    names = exported(text)
    expressions = all_expressions(rendered_monitoring())
    named = {name for expr in expressions for name in metric_names(expr)}
    assert len(named) >= 25  # the parser found the dashboard's breadth, not nothing
    assert sorted(named - set(names)) == [], "named in the dashboard or alerts, not exported"
    # Label values the queries match on exist in the code's closed sets.
    for metric, label, operator, value in (m for e in expressions for m in matchers(e)):
        allowed = closed_set(label, metric)
        assert allowed is None or operator != "=" or value in allowed, (metric, label, value)

    # Hygiene: help on every family; label values of closed labels inside their set.
    families = list(prom_parser.text_string_to_metric_families(text))
    assert [f.name for f in families if not f.documentation.strip()] == []
    samples = [s for f in families for s in f.samples]
    invalid = {s.labels["reason"]: s.value for s in samples if s.name == "scaler_policy_invalid"}
    # broken.yaml has three field problems (two missing, one misspelt), counted; the
    # misspelt name, free text, is in the log and nowhere in /metrics.
    assert invalid == {"invalid_field": 3.0, "yaml": 1.0, "unreadable": 1.0, "duplicate": 1.0}
    assert "replicaz" not in text
    assert all(set(s.labels) == {"path", "reason"} for s in samples
               if s.name == "scaler_policy_invalid")
    for sample in samples:
        for label, value in sample.labels.items():
            allowed = closed_set(label, sample.name)
            assert allowed is None or value in allowed, (sample.name, label, value)
    cost_help = {f.name: f.documentation for f in families if "cost" in f.name}
    assert cost_help and all("currency" in h for h in cost_help.values()), cost_help
    refused = {s.labels["reason"]: s.value for s in samples
               if s.name == "scaler_signals_refused_total"}
    assert refused == {"stale": 1.0}
    # The evaluation histogram: cumulative buckets ending at the count.
    buckets = [s.value for s in samples if s.name == "scaler_evaluation_duration_seconds_bucket"]
    (count,) = [s.value for s in samples if s.name == "scaler_evaluation_duration_seconds_count"]
    assert count >= 1 and buckets == sorted(buckets) and buckets[-1] == count
