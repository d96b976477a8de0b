"""The chart's optional objects (Ingress, HTTPRoute, NetworkPolicy, PrometheusRule, the
helm test Pod) and the task settings, rendered by real Helm.

Core kinds (Ingress, NetworkPolicy, Pod) are validated against Kubernetes' schemas in
test_helm_chart's `everything-on` scenario. HTTPRoute and PrometheusRule are CRDs that
kubernetes-validate has no schemas for: their shape is asserted here field by field, the
alerts' metric names are checked against what service/metrics.py exports, and their PromQL
is parsed with Prometheus' own grammar (lezer-promql). test_helm_chart validates them, and
the ServiceMonitor, against their CRDs' OpenAPI schemas (kubernetes-models' packages).
Both tools are npm packages pinned in tests/deploy/node, installed with `npm ci` on first
use."""

import json
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from service.metrics import Metrics
from tests.deploy.chart import (
    DSN,
    EVERYTHING_ON,
    NAMESPACE,
    POSTGRES_PEER,
    RELEASE,
    Manifests,
    container,
    env_of,
    only,
    pod_spec,
    secret_file,
)
from tests.deploy.conftest import NodeCheck

DEFAULTS = {"database": {"url": DSN}}
OPTIONAL_KINDS = ("Ingress", "HTTPRoute", "NetworkPolicy", "PrometheusRule", "Pod")


@pytest.fixture(scope="module")
def everything(render: Callable[[dict[str, Any]], Manifests]) -> Manifests:
    return render(EVERYTHING_ON)


def api_service(manifests: Manifests) -> dict[str, Any]:
    return manifests[("Service", RELEASE)]


def test_all_off_by_default_but_the_network_policy(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    kinds = {kind for kind, _ in render(DEFAULTS)}
    assert kinds & set(OPTIONAL_KINDS) == {"NetworkPolicy"}


# --- Ingress and HTTPRoute -----------------------------------------------------------------


def test_ingress_routes_to_the_api_service(everything: Manifests) -> None:
    ingress = only(everything, "Ingress")
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"secretName": "tickgate-tls", "hosts": ["tickgate.example.com"]}]
    assert ingress["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt"}
    (rule,) = spec["rules"]
    assert rule["host"] == "tickgate.example.com"
    paths = rule["http"]["paths"]
    assert ("/v1", "Prefix") in {(path["path"], path["pathType"]) for path in paths}
    service = api_service(everything)
    for path in paths:
        backend = path["backend"]["service"]
        assert backend["name"] == service["metadata"]["name"]
        assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}


def test_http_route_attaches_to_the_gateway_and_routes_to_the_service(
    everything: Manifests,
) -> None:
    route = only(everything, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["namespace"] == NAMESPACE
    spec = route["spec"]
    assert spec.keys() == {"parentRefs", "hostnames", "rules"}
    assert spec["parentRefs"] == [
        {"name": "public", "namespace": "gateway-system", "sectionName": "https"}
    ]
    assert spec["hostnames"] == ["tickgate.example.com"]
    (rule,) = spec["rules"]
    assert rule.keys() == {"matches", "backendRefs"}
    assert {"path": {"type": "PathPrefix", "value": "/v1"}} in rule["matches"]
    service = api_service(everything)
    assert rule["backendRefs"] == [
        {"name": service["metadata"]["name"], "port": service["spec"]["ports"][0]["port"]}
    ]


def test_http_route_needs_a_gateway(helm: ModuleType, chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"httpRoute\.parentRefs"):
        chart.render(DEFAULTS | {"httpRoute": {"enabled": True}}, name=RELEASE)


# --- NetworkPolicy -------------------------------------------------------------------------


def pod_labels(manifests: Manifests) -> dict[str, dict[str, str]]:
    """Every pod template (and the bare test Pod) by owner: kind/name -> labels."""
    found = {}
    for (kind, name), obj in manifests.items():
        if kind in {"Deployment", "Job"}:
            found[f"{kind}/{name}"] = obj["spec"]["template"]["metadata"]["labels"]
        elif kind == "Pod":
            found[f"{kind}/{name}"] = obj["metadata"]["labels"]
    return found


def test_network_policy_covers_every_pod_of_the_release(everything: Manifests) -> None:
    policy = only(everything, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    selector = policy["podSelector"]["matchLabels"]
    pods = pod_labels(everything)
    assert len(pods) == 4  # API and scheduler Deployments, migration Job, helm test Pod
    for owner, labels in pods.items():
        assert selector.items() <= labels.items(), owner


def test_network_policy_lets_in_only_the_api_port(everything: Manifests) -> None:
    (rule,) = only(everything, "NetworkPolicy")["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert container(everything)["ports"][0]["containerPort"] == 8080
    assert rule["from"] == EVERYTHING_ON["networkPolicy"]["ingressFrom"]


def test_network_policy_lets_out_dns_postgresql_the_api_and_the_listed_targets(
    everything: Manifests, values: dict[str, Any]
) -> None:
    rules = only(everything, "NetworkPolicy")["spec"]["egress"]
    dns, postgresql, own_api, *targets = rules
    assert dns["to"] == values["networkPolicy"]["dns"]
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    assert postgresql == {"to": [POSTGRES_PEER], "ports": [{"port": 5432, "protocol": "TCP"}]}
    api_pods = pod_labels(everything)[f"Deployment/{RELEASE}"]
    assert own_api["to"][0]["podSelector"]["matchLabels"].items() <= api_pods.items()
    assert targets == [
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}}],
            "ports": [{"port": 443, "protocol": "TCP"}],
        },
        {
            "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
            "ports": [{"port": 80, "protocol": "TCP"}, {"port": 8080, "protocol": "TCP"}],
        },
    ]


def test_by_default_the_network_policy_admits_the_namespace_and_lets_out_the_public(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    """On by default (#42): ingress from the release's namespace only (ingress
    controllers and Prometheus to be added), egress to DNS, PostgreSQL's port anywhere
    (until networkPolicy.postgresql.to names it), and public addresses on 80 and 443,
    never private ranges or the metadata address."""
    policy = only(render(DEFAULTS), "NetworkPolicy")["spec"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {}}]
    _dns, postgresql, _own_api, public = policy["egress"]
    assert postgresql == {"ports": [{"port": 5432, "protocol": "TCP"}]}
    (block,) = public["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8"} <= set(block["ipBlock"]["except"])
    assert public["ports"] == [{"port": 80, "protocol": "TCP"}, {"port": 443, "protocol": "TCP"}]


def test_the_default_routes_leave_metrics_and_the_probes_out(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    """#42: /metrics lists every job; the default Ingress and HTTPRoute route the API,
    the dashboard and the docs only."""
    parent = {"parentRefs": [{"name": "public"}]}
    manifests = render(
        DEFAULTS | {"ingress": {"enabled": True}, "httpRoute": {"enabled": True} | parent}
    )
    (rule,) = only(manifests, "Ingress")["spec"]["rules"]
    routed = {(p["path"], p["pathType"]) for p in rule["http"]["paths"]}
    assert ("/v1", "Prefix") in routed
    assert ("/", "Exact") in routed
    assert not any(path.startswith(("/metrics", "/healthz", "/readyz")) for path, _ in routed)
    assert ("/", "Prefix") not in routed
    (route,) = only(manifests, "HTTPRoute")["spec"]["rules"]
    values = {match["path"]["value"] for match in route["matches"]}
    assert "/v1" in values
    assert "/metrics" not in values


# --- PrometheusRule ------------------------------------------------------------------------


def exported_metric_names() -> set[str]:
    """The series names service/metrics.py exports (counters with their _total)."""
    metrics = Metrics()
    metrics.runs.labels("job", "failed").inc()
    metrics.last_success.labels("job").set(1)
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


def test_prometheus_rule_alerts(everything: Manifests) -> None:
    rule = only(everything, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (group,) = rule["spec"]["groups"]
    alerts = {alert["alert"]: alert for alert in group["rules"]}
    assert set(alerts) == {
        "TickgateJobsOverdue",
        "TickgateOverdueCheckStale",
        "TickgateSchedulerNotSynced",
        "TickgateJobSuccessStale",
        "TickgateJobFailing",
    }
    for name, alert in alerts.items():
        assert alert.keys() == {"alert", "expr", "for", "labels", "annotations"}, name
        assert re.fullmatch(r"[0-9]+[smh]", alert["for"]), name
        assert alert["labels"] == {"severity": "warning"}, name
        assert {"summary", "description"} <= alert["annotations"].keys(), name
        expr = alert["expr"]
        assert expr.count("(") == expr.count(")"), name
        assert expr.count("{") == expr.count("}"), name


def test_alert_expressions_are_valid_promql(everything: Manifests, node_check: NodeCheck) -> None:
    """The Prometheus Operator's admission webhook refuses a rule it cannot parse, which
    would fail `helm install`."""
    (group,) = only(everything, "PrometheusRule")["spec"]["groups"]
    expressions = {alert["alert"]: alert["expr"] for alert in group["rules"]}
    assert node_check("promql.mjs", expressions) == {}
    # The parser does find errors: the same rules with one bracket dropped each.
    broken = {name: expr.replace(")", "", 1) for name, expr in expressions.items()}
    assert set(node_check("promql.mjs", broken)) == set(expressions)


def test_alerts_read_metrics_tickgate_exports(everything: Manifests) -> None:
    (group,) = only(everything, "PrometheusRule")["spec"]["groups"]
    exported = exported_metric_names()
    used = {name for alert in group["rules"] for name in re.findall(r"tickgate_\w+", alert["expr"])}
    assert used == {
        "tickgate_jobs_overdue",
        "tickgate_overdue_checked_timestamp_seconds",
        "tickgate_scheduler_sync_age_seconds",
        "tickgate_job_last_success_timestamp_seconds",
        "tickgate_runs_total",
    }
    assert used <= exported, used - exported
    failing = next(a for a in group["rules"] if a["alert"] == "TickgateJobFailing")["expr"]
    statuses = set(re.findall(r'status=~"([^"]+)"', failing)[0].split("|"))
    from service.domain.runs import RunStatus

    assert statuses <= {status.value for status in RunStatus}


def test_alerts_select_the_series_the_service_monitor_scrapes(everything: Manifests) -> None:
    """Prometheus Operator labels each series with the namespace and the Service scraped;
    the rules select this release's API and scheduler Services."""
    (group,) = only(everything, "PrometheusRule")["spec"]["groups"]
    services = [name for kind, name in everything if kind == "Service"]
    assert sorted(services) == [RELEASE, f"{RELEASE}-scheduler"]
    for alert in group["rules"]:
        for selector in re.findall(r"\{([^}]*)\}", alert["expr"]):
            assert f'namespace="{NAMESPACE}"' in selector, alert["alert"]
            (pattern,) = re.findall(r'service=~"([^"]+)"', selector)
            assert all(re.fullmatch(pattern, service) for service in services)
    # Tickgate's `job` label arrives as exported_job beside the target's own `job`.
    stale = next(a for a in group["rules"] if a["alert"] == "TickgateJobSuccessStale")
    assert "max by (exported_job)" in stale["expr"]
    # A pod keeps a job's series while it owns the job: over the threshold's range, the
    # last success a pod exported before a handover or a restart still counts.
    assert re.search(
        r"max_over_time\(tickgate_job_last_success_timestamp_seconds\{[^}]*\}\[90000s\]\)",
        stale["expr"],
    )


# --- helm test -----------------------------------------------------------------------------


def test_helm_test_pod(everything: Manifests) -> None:
    (pod,) = [obj for (kind, _), obj in everything.items() if kind == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    (test,) = spec["containers"]
    assert test["image"] == container(everything)["image"]
    assert test["command"] == ["python", "-c"]
    script = test["args"][0]
    assert "curl" not in script
    for needed in ('"/readyz"', '"/v1/jobs', '"Authorization"'):
        assert needed in script
    env = {entry["name"]: entry["value"] for entry in test["env"]}
    service = api_service(everything)
    assert env["TICKGATE_URL"] == f"http://{service['metadata']['name']}:80"
    tokens_dir = env["TICKGATE_API_TOKENS_FILE"].rpartition("/")[0]
    (mount,) = test["volumeMounts"]
    assert (mount["mountPath"], mount["readOnly"]) == (tokens_dir, True)
    assert spec["volumes"][0]["secret"]["secretName"] == f"{RELEASE}-auth"
    assert test["securityContext"]["readOnlyRootFilesystem"] is True


def test_notes_name_the_routes_and_the_test(notes: Callable[[dict[str, Any]], str]) -> None:
    text = notes(EVERYTHING_ON)
    assert "Ingress: https://tickgate.example.com/" in text
    assert f"HTTPRoute: {RELEASE}, attached to public." in text
    assert f"helm test {RELEASE} --namespace {NAMESPACE} --logs" in text
    defaults = notes(DEFAULTS)
    for absent in ("Ingress:", "HTTPRoute:", "helm test"):
        assert absent not in defaults


# --- task and scheduler settings -----------------------------------------------------------


def test_task_settings_env(everything: Manifests, render: Callable[..., Manifests]) -> None:
    env = env_of(container(everything))
    assert env["TICKGATE_TASK_MODULES"]["value"] == "acme_tasks.billing,acme_tasks.reports"
    assert env["TICKGATE_HTTP_ALLOW"]["value"] == "10.20.0.0/16,reports.internal"
    assert env["TICKGATE_SQL_ALLOW_SELF"]["value"] == "true"
    # Files from the Secret, not env vars (#42): no DSN in the process environment.
    assert not {"TICKGATE_SQL_TARGETS", "TICKGATE_SQL_SELF_URL"} & set(env)
    pod = pod_spec(everything)
    targets = secret_file(pod, "TICKGATE_SQL_TARGETS_FILE")
    assert targets == {"name": "sql-targets", "key": "TICKGATE_SQL_TARGETS"}
    # `self` runs as a role of its own (#42), its DSN from the same Secret.
    self_url = secret_file(pod, "TICKGATE_SQL_SELF_URL_FILE")
    assert self_url == {"name": "sql-targets", "key": "TICKGATE_SQL_SELF_URL"}
    defaults = env_of(container(render(DEFAULTS)))
    assert not {"TICKGATE_SQL_TARGETS_FILE", "TICKGATE_SQL_SELF_URL_FILE"} & set(defaults)
    assert "sql-targets" not in {v["name"] for v in pod_spec(render(DEFAULTS))["volumes"]}
    assert defaults["TICKGATE_TASK_MODULES"]["value"] == ""
    assert defaults["TICKGATE_HTTP_ALLOW"]["value"] == ""
    assert defaults["TICKGATE_SQL_ALLOW_SELF"]["value"] == "false"
    assert defaults["TICKGATE_RUN_HISTORY"]["value"] == "1000"
    assert defaults["TICKGATE_RECONCILE_SECONDS"]["value"] == "30"
    # Large counts stay integers (Helm reads YAML numbers as floats: 1e+06).
    history = env_of(container(render(DEFAULTS | {"runHistory": 1_000_000})))
    assert history["TICKGATE_RUN_HISTORY"]["value"] == "1000000"


TRACING_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")


def test_tracing_is_off_until_an_otlp_endpoint_is_set(
    everything: Manifests, render: Callable[..., Manifests]
) -> None:
    env = env_of(container(everything))
    assert [env[name]["value"] for name in TRACING_ENV] == [
        "http://otel-collector.observability:4318",
        "parentbased_traceidratio",
        "0.25",
    ]
    defaults = env_of(container(render(DEFAULTS)))
    assert not set(TRACING_ENV) & set(defaults)


def test_default_hooks_and_the_public_url_reach_the_settings(
    everything: Manifests, render: Callable[..., Manifests]
) -> None:
    from service.config import Settings

    env = env_of(container(everything))
    read = Settings.model_validate(
        {
            "default_hooks": json.loads(env["TICKGATE_DEFAULT_HOOKS"]["value"]),
            "public_url": env["TICKGATE_PUBLIC_URL"]["value"],
        }
    )
    [hook] = read.default_hooks
    assert (hook.on, hook.action.model_dump()) == (
        ["failure"],
        {"kind": "http", "args": {"url": "https://alerts.example.com/tg"}},
    )
    assert read.public_url == "https://tickgate.example.com"
    defaults = env_of(container(render(DEFAULTS)))
    assert not {"TICKGATE_DEFAULT_HOOKS", "TICKGATE_PUBLIC_URL"} & set(defaults)


def test_the_settings_the_chart_sets_exist(render: Callable[..., Manifests]) -> None:
    """Each TICKGATE_* variable the chart sets is a real setting of service/config.py."""
    from service.config import Settings

    known = {f"TICKGATE_{name.upper()}" for name in Settings.model_fields} | {"DATABASE_URL_FILE"}
    known |= set(TRACING_ENV)  # what the OpenTelemetry SDK reads itself
    for manifests in (render(DEFAULTS), render(EVERYTHING_ON)):
        for (kind, name), obj in manifests.items():
            if kind not in {"Deployment", "Job"}:
                continue
            for spec in obj["spec"]["template"]["spec"]["containers"]:
                assert set(env_of(spec)) <= known, (kind, name)


def test_the_scheduler_can_be_turned_off(
    helm: ModuleType, chart: Any, render: Callable[..., Manifests]
) -> None:
    env = env_of(container(render(DEFAULTS | {"scheduler": False})))
    assert env["TICKGATE_SCHEDULER"]["value"] == "false"
    with pytest.raises(helm.HelmRenderError, match="schedulerDeployment"):
        chart.render(
            DEFAULTS | {"scheduler": False, "schedulerDeployment": {"enabled": True}}, name=RELEASE
        )


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"tasks": {"modules": ["not a module"]}}, "/tasks/modules/0"),
        ({"tasks": {"http": {"allow": ["10.0.0.0/8,10.1.0.0/16"]}}}, "/tasks/http/allow/0"),
        ({"runHistory": 0}, "/runHistory"),
        ({"networkPolicy": {"egress": [{"ports": [443]}]}}, "cidr"),
        ({"prometheusRule": {"failureRatio": 2}}, "/prometheusRule/failureRatio"),
        ({"prometheusRule": {"overdueFor": "ten minutes"}}, "/prometheusRule/overdueFor"),
        ({"ingress": {"hosts": [{"host": "x", "paths": [{"path": "api"}]}]}}, "/path"),
        ({"helmTest": {"enable": True}}, "enable"),
        ({"tracing": {"otlpEndpoint": "collector:4318"}}, "/tracing/otlpEndpoint"),
        ({"tracing": {"sampleRatio": 2}}, "/tracing/sampleRatio"),
    ],
)
def test_the_schema_refuses_bad_new_values(
    helm: ModuleType, chart: Any, bad: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(DEFAULTS | bad)
