"""The Helm chart, rendered and linted by real Helm (helm_python, Helm v4 in a wheel), every
manifest validated against Kubernetes' OpenAPI schemas with kubernetes-validate."""

import base64
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.deploy import CHART_DIR, ROOT, exposed_ports, final_stage, user_ids
from tests.deploy.chart import (
    CUSTOM_KINDS,
    DSN,
    EVERYTHING_ON,
    NAMESPACE,
    RELEASE,
    Manifests,
    container,
    env_of,
    named_port,
    only,
    pod_spec,
    secret_file,
    validate_kubernetes,
)
from tests.deploy.conftest import NodeCheck

JOBS: list[dict[str, Any]] = [
    {
        "name": "standup",
        "schedule": {"kind": "cron", "expression": "30 9 * * MON-FRI"},
        "timezone": "Europe/Kyiv",
        "task": "log",
        "args": {"message": "stand-up time", "level": "info"},
    },
    {
        "name": "nightly-report",
        "description": "wall times and look-alikes must stay strings",
        "schedule": {"kind": "daily", "every_days": 1, "at": ["03:00", "15:30:15"]},
        "timezone": "America/New_York",
        "task": "http",
        "args": {
            "url": "http://reports.internal/run",
            "headers": {"X-Flag": "on", "X-Answer": "yes"},
            "body": {"since": "2026-01-01T00:00:00Z", "limit": 10, "ratio": 0.5, "none": None},
            "success_status": [200, 204],
        },
        "overlap": "allow",
        "timeout_seconds": 120,
        "misfire_grace_seconds": 0,
    },
    {
        "name": "every-5-min",
        "schedule": {"kind": "interval", "every_seconds": 300, "anchor": "2026-01-01T00:00:00Z"},
        "task": "log",
        "args": {"message": "tick"},
    },
]

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {"database": {"url": DSN}},
    "existing-secret": {
        "database": {"existingSecret": "pg-credentials", "existingSecretKey": "dsn"}
    },
    "monitoring-and-hpa": {
        "database": {"url": DSN},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "autoscaling": {"enabled": True, "targetMemoryUtilizationPercentage": 90},
    },
    "jobs": {"database": {"url": DSN}, "jobs": JOBS},
    "hook-job": {"database": {"url": DSN}, "migrations": {"hookJob": {"enabled": True}}},
    "hook-job-existing-secret": {
        "database": {"existingSecret": "pg-credentials"},
        "migrations": {"hookJob": {"enabled": True}},
    },
    "everything-on": EVERYTHING_ON,
    "scheduler-deployment": {
        "database": {"url": DSN},
        "jobs": JOBS,
        "schedulerDeployment": {
            "enabled": True,
            "replicaCount": 2,
            "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
        },
        "serviceMonitor": {"enabled": True},
        "autoscaling": {"enabled": True},
    },
}


@pytest.fixture(scope="module")
def scenario(render: Callable[[dict[str, Any]], Manifests]) -> Callable[[str], Manifests]:
    cache: dict[str, Manifests] = {}

    def rendered(name: str) -> Manifests:
        if name not in cache:
            cache[name] = render(SCENARIOS[name])
        return cache[name]

    return rendered


# --- Helm lint and Kubernetes schemas ------------------------------------------------------


@pytest.mark.parametrize("name", SCENARIOS)
def test_helm_lint_passes(helm: ModuleType, name: str) -> None:
    report = helm.lint(
        CHART_DIR, SCENARIOS[name], strict=True, namespace=NAMESPACE, kube_version="v1.33.0"
    )
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_manifest_is_valid_kubernetes(
    scenario: Callable[[str], Manifests], node_check: NodeCheck, name: str
) -> None:
    """Core kinds against Kubernetes' OpenAPI schemas (kubernetes-validate); custom
    resources (ServiceMonitor, PrometheusRule, HTTPRoute) against their CRDs' schemas."""
    custom = []
    for (kind, object_name), obj in scenario(name).items():
        assert obj["metadata"].get("namespace") == NAMESPACE, (kind, object_name)
        if kind in CUSTOM_KINDS:
            custom.append(obj)
        else:
            validate_kubernetes(obj)
    assert node_check("crd.mjs", custom) == {}


# --- what is rendered ----------------------------------------------------------------------


def test_defaults_render_the_core_objects_only(scenario: Callable[[str], Manifests]) -> None:
    kinds = sorted(kind for kind, _ in scenario("defaults"))
    # The two Secrets: the database URL and the API tokens; the NetworkPolicy, on by
    # default (#42).
    assert kinds == [
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
        "Secret",
        "Service",
        "ServiceAccount",
    ]


def test_chart_versions_follow_pyproject(chart: Any, values: dict[str, Any]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart.metadata["apiVersion"] == "v2"
    assert chart.metadata["appVersion"] == project["version"]
    assert values["image"]["tag"] == ""


def test_image_tag_defaults_to_app_version(
    render: Callable[[dict[str, Any]], Manifests], scenario: Callable[[str], Manifests]
) -> None:
    assert container(scenario("defaults"))["image"] == "tickgate:0.1.0"
    pinned = render(
        {
            "database": {"url": DSN},
            "image": {"repository": "registry.example/tickgate", "tag": "1.2.3"},
        }
    )
    assert container(pinned)["image"] == "registry.example/tickgate:1.2.3"
    digest = "sha256:" + "ab" * 32
    by_digest = render({"database": {"url": DSN}, "image": {"repository": "r/t", "digest": digest}})
    assert container(by_digest)["image"] == f"r/t@{digest}"


# --- ports and probes ----------------------------------------------------------------------


def test_ports_line_up_with_the_image(
    scenario: Callable[[str], Manifests], values: dict[str, Any]
) -> None:
    manifests = scenario("defaults")
    main = container(manifests)
    http = named_port(main, "http")
    assert {http} == exposed_ports(final_stage()) == {values["containerPort"]} == {8080}
    assert main["args"] == ["serve", "--host", "0.0.0.0", "--port", str(http)]
    service = only(manifests, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    (port,) = service["spec"]["ports"]
    assert port["name"] == "http"
    assert port["port"] == 80
    target = port["targetPort"]
    assert (named_port(main, target) if isinstance(target, str) else target) == http
    deployment = only(manifests, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def test_probes(scenario: Callable[[str], Manifests]) -> None:
    main = container(scenario("defaults"))
    expected = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for probe, path in expected.items():
        get = main[probe]["httpGet"]
        assert get["path"] == path, probe
        port = get["port"]
        assert (named_port(main, port) if isinstance(port, str) else port) == 8080, probe
    startup = main["startupProbe"]
    # Migrations (and waiting for another replica's migration lock) fit in the budget.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


# --- pods ----------------------------------------------------------------------------------


def test_replicas_default_to_three(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("defaults")
    assert only(manifests, "Deployment")["spec"]["replicas"] == 3
    budget = only(manifests, "PodDisruptionBudget")["spec"]
    assert budget.get("maxUnavailable") == 1 or budget.get("minAvailable") == 1


def test_hpa_owns_the_replica_count(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("monitoring-and-hpa")
    deployment = only(manifests, "Deployment")
    assert "replicas" not in deployment["spec"]
    hpa = only(manifests, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] == 3
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"]} == {"cpu", "memory"}


def test_security_context(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("defaults")
    uid, gid = user_ids(final_stage())
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    pod_context = pod["securityContext"]
    assert pod_context["runAsNonRoot"] is True
    assert pod_context["runAsUser"] == uid
    assert pod_context["runAsGroup"] == gid
    assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container(manifests)["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == uid
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"]: m["name"] for m in container(manifests)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_pod_hygiene(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("defaults")
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    # Service links would inject TICKGATE_PORT=tcp://... into the TICKGATE_ settings space.
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False
    account = only(manifests, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    resources = container(manifests)["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]


def test_termination_grace_outlasts_the_shutdown_grace(
    render: Callable[[dict[str, Any]], Manifests], scenario: Callable[[str], Manifests]
) -> None:
    for manifests, grace in (
        (scenario("defaults"), 30),
        (render(SCENARIOS["defaults"] | {"shutdownGraceSeconds": 300}), 300),
    ):
        pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
        env = env_of(container(manifests))
        assert env["TICKGATE_SHUTDOWN_GRACE_SECONDS"]["value"] == str(grace)
        pre_stop = container(manifests)["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        # SIGTERM arrives after the preStop sleep; runs then get their grace, plus headroom.
        assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + grace + 10


def test_runner_id_comes_from_the_pod_name(scenario: Callable[[str], Manifests]) -> None:
    runner = env_of(container(scenario("defaults")))["TICKGATE_RUNNER_ID"]
    assert runner["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_settings_env(
    render: Callable[[dict[str, Any]], Manifests], scenario: Callable[[str], Manifests]
) -> None:
    env = env_of(container(scenario("defaults")))
    assert env["TICKGATE_LOG_FORMAT"]["value"] == "json"
    assert env["TICKGATE_REQUIRE_DATABASE_URL"]["value"] == "1"
    assert env["TICKGATE_API_POOL_SIZE"]["value"] == "10"
    assert env["TICKGATE_MAX_CONCURRENT_RUNS"]["value"] == "5000"
    assert env["TICKGATE_LOCK_SESSIONS"]["value"] == "4"
    assert env["TICKGATE_TAKEOVER_SECONDS"]["value"] == "3"
    assert env["TICKGATE_OWNERSHIP"]["value"] == "true"
    assert env["TICKGATE_DB_LINK_TIMEOUT_SECONDS"]["value"] == "30"
    assert "TICKGATE_APPLY_JOBS" not in env
    changed = render(
        SCENARIOS["defaults"]
        | {
            "maxConcurrentRuns": 16,
            "takeoverSeconds": 1.5,
            "dbLinkTimeoutSeconds": 60,
            "ownership": False,
            "lockSessions": 2,
            "logFormat": "text",
            "runHistory": 500,
            "extraEnv": [{"name": "TICKGATE_MAX_BODY_BYTES", "value": "2097152"}],
        }
    )
    env = env_of(container(changed))
    assert env["TICKGATE_MAX_CONCURRENT_RUNS"]["value"] == "16"
    assert env["TICKGATE_TAKEOVER_SECONDS"]["value"] == "1.5"
    assert env["TICKGATE_DB_LINK_TIMEOUT_SECONDS"]["value"] == "60"
    assert env["TICKGATE_OWNERSHIP"]["value"] == "false"
    assert env["TICKGATE_LOCK_SESSIONS"]["value"] == "2"
    assert env["TICKGATE_LOG_FORMAT"]["value"] == "text"
    assert env["TICKGATE_RUN_HISTORY"]["value"] == "500"
    assert env["TICKGATE_MAX_BODY_BYTES"]["value"] == "2097152"


def test_extra_env_cannot_repeat_the_charts_own(helm: ModuleType, chart: Any) -> None:
    """Kubernetes would let the later entry win without a word; rendering fails instead."""
    values = SCENARIOS["defaults"] | {"extraEnv": [{"name": "TICKGATE_RUN_HISTORY", "value": "5"}]}
    with pytest.raises(helm.HelmRenderError, match=r"TICKGATE_RUN_HISTORY.*runHistory"):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


# --- database ------------------------------------------------------------------------------


def test_database_url_from_the_charts_secret(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("defaults")
    # A file, not an env var (#42): no DSN in the pods' process environment.
    assert "DATABASE_URL" not in env_of(container(manifests))
    reference = secret_file(pod_spec(manifests), "DATABASE_URL_FILE")
    secret = manifests[("Secret", reference["name"])]
    assert base64.b64decode(secret["data"][reference["key"]]).decode() == DSN
    annotations = only(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/database" in annotations  # a new DSN rolls the pods


def test_database_url_from_an_existing_secret(
    render: Callable[[dict[str, Any]], Manifests], scenario: Callable[[str], Manifests]
) -> None:
    manifests = scenario("existing-secret")
    assert [key for key in manifests if key[0] == "Secret"] == [("Secret", f"{RELEASE}-auth")]
    reference = secret_file(pod_spec(manifests), "DATABASE_URL_FILE")
    assert reference == {"name": "pg-credentials", "key": "dsn"}
    default_key = render({"database": {"existingSecret": "pg-credentials"}})
    reference = secret_file(pod_spec(default_key), "DATABASE_URL_FILE")
    assert reference == {"name": "pg-credentials", "key": "DATABASE_URL"}


def test_rendering_fails_clearly_without_a_database(helm: ModuleType, chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"no database configured\. Set database\.url"):
        chart.render({}, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(
        helm.HelmRenderError, match=r"only one of database\.url and database\.existingSecret"
    ):
        chart.render(
            {"database": {"url": DSN, "existingSecret": "pg"}}, name=RELEASE, namespace=NAMESPACE
        )


# --- migrations ----------------------------------------------------------------------------


def test_migrations_run_at_startup_by_default(scenario: Callable[[str], Manifests]) -> None:
    assert [key for key in scenario("defaults") if key[0] == "Job"] == []


@pytest.mark.parametrize("name", ["hook-job", "hook-job-existing-secret"])
def test_optional_migration_hook_job(scenario: Callable[[str], Manifests], name: str) -> None:
    manifests = scenario(name)
    job = only(manifests, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    pod = job["spec"]["template"]["spec"]
    (migrate,) = pod["containers"]
    assert migrate["args"] == ["migrate"]
    assert migrate["image"] == container(manifests)["image"]
    assert migrate["securityContext"]["readOnlyRootFilesystem"] is True
    # Hooks run before the release's ServiceAccount and Secret exist.
    assert "serviceAccountName" not in pod
    assert "DATABASE_URL" not in env_of(migrate)
    reference = secret_file(pod, "DATABASE_URL_FILE")
    if name == "hook-job-existing-secret":
        assert reference == {"name": "pg-credentials", "key": "DATABASE_URL"}
        return
    secret = manifests[("Secret", reference["name"])]
    hook = secret["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(hook["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    assert base64.b64decode(secret["data"][reference["key"]]).decode() == DSN


# --- declarative jobs ----------------------------------------------------------------------


def test_jobs_configmap_mount_and_env(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("jobs")
    config_map = only(manifests, "ConfigMap")
    assert yaml.safe_load(config_map["data"]["jobs.yaml"]) == JOBS
    main = container(manifests)
    path = env_of(main)["TICKGATE_APPLY_JOBS"]["value"]
    assert path == "/etc/tickgate/jobs.yaml"
    directory, _, filename = path.rpartition("/")
    (mount,) = [m for m in main["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert volume["configMap"]["items"] == [{"key": "jobs.yaml", "path": filename}]


def test_the_service_accepts_the_jobs_file(
    scenario: Callable[[str], Manifests], tmp_path: Path
) -> None:
    """The rendered file goes through Tickgate's own loader for TICKGATE_APPLY_JOBS, and
    each job it holds is a valid job body."""
    declarative = pytest.importorskip("service.api.declarative")
    models = pytest.importorskip("service.api.models")
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(only(scenario("jobs"), "ConfigMap")["data"]["jobs.yaml"])
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(JOBS))
    loaded = declarative.load_job_file(rendered)
    assert [models.JobCreate.model_validate(job).name for job in loaded] == [
        job["name"] for job in JOBS
    ]
    assert loaded == declarative.load_job_file(reference)


def test_changed_jobs_roll_the_pods(
    render: Callable[[dict[str, Any]], Manifests], scenario: Callable[[str], Manifests]
) -> None:
    def checksum(manifests: Manifests) -> str:
        deployment = only(manifests, "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/jobs"]

    changed = [JOBS[0] | {"args": {"message": "stand-up time!"}}, *JOBS[1:]]
    assert checksum(scenario("jobs")) != checksum(render(SCENARIOS["jobs"] | {"jobs": changed}))


def test_no_jobs_no_configmap(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("defaults")
    assert [key for key in manifests if key[0] == "ConfigMap"] == []
    annotations = only(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/jobs" not in annotations


def test_duplicate_job_names_fail(helm: ModuleType, chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match='"standup" is declared twice'):
        chart.render({"database": {"url": DSN}, "jobs": [JOBS[0], JOBS[0]]}, name=RELEASE)


# --- process model: one pod, two processes; or the scheduler in a Deployment of its own ----


def test_by_default_each_pod_runs_both_roles(scenario: Callable[[str], Manifests]) -> None:
    """`tickgate serve` runs the scheduler and the API in two processes of one pod."""
    env = env_of(container(scenario("defaults")))
    assert "TICKGATE_API" not in env
    assert "TICKGATE_SCHEDULER" not in env
    assert [key for key in scenario("defaults") if key[0] == "Deployment"] == [
        ("Deployment", RELEASE)
    ]


def test_scheduler_deployment_splits_the_roles(scenario: Callable[[str], Manifests]) -> None:
    manifests = scenario("scheduler-deployment")
    api = manifests[("Deployment", RELEASE)]
    scheduler = manifests[("Deployment", f"{RELEASE}-scheduler")]
    [api_container] = api["spec"]["template"]["spec"]["containers"]
    [scheduler_container] = scheduler["spec"]["template"]["spec"]["containers"]
    api_env, scheduler_env = env_of(api_container), env_of(scheduler_container)
    assert api_env["TICKGATE_SCHEDULER"]["value"] == "false"
    assert "TICKGATE_API" not in api_env
    assert scheduler_env["TICKGATE_API"]["value"] == "false"
    assert "TICKGATE_SCHEDULER" not in scheduler_env
    # The API pods apply the jobs file; the scheduler pods neither mount nor apply it.
    assert "TICKGATE_APPLY_JOBS" in api_env
    assert "TICKGATE_APPLY_JOBS" not in scheduler_env
    assert {m["name"] for m in scheduler_container["volumeMounts"]} == {
        "tmp",
        "database",
        "api-tokens",
    }
    # The autoscaler owns the API pods' count; the scheduler pods have their own.
    assert "replicas" not in api["spec"]
    assert scheduler["spec"]["replicas"] == 2
    hpa = only(manifests, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == RELEASE
    assert scheduler_container["resources"] == {"limits": {"cpu": "2", "memory": "1Gi"}}
    assert api_container["resources"]["limits"]["memory"] == "512Mi"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert scheduler_container[probe] == api_container[probe], probe
    assert scheduler_container["args"] == api_container["args"]
    assert env_of(scheduler_container)["TICKGATE_RUNNER_ID"] == api_env["TICKGATE_RUNNER_ID"]


def test_scheduler_pods_take_no_api_traffic(scenario: Callable[[str], Manifests]) -> None:
    """Neither the API Service nor the API Deployment selects the scheduler pods (and
    the reverse); a headless Service names the scheduler pods for the ServiceMonitor."""
    manifests = scenario("scheduler-deployment")
    pods = {
        name: obj["spec"]["template"]["metadata"]["labels"]
        for (kind, name), obj in manifests.items()
        if kind == "Deployment"
    }
    selectors = {
        name: obj["spec"]["selector"]["matchLabels"]
        for (kind, name), obj in manifests.items()
        if kind == "Deployment"
    }
    for name, selector in selectors.items():
        matched = [pod for pod, labels in pods.items() if selector.items() <= labels.items()]
        assert matched == [name]
    api_service = manifests[("Service", RELEASE)]
    scheduler_service = manifests[("Service", f"{RELEASE}-scheduler")]
    assert api_service["spec"]["selector"].items() <= pods[RELEASE].items()
    assert not api_service["spec"]["selector"].items() <= pods[f"{RELEASE}-scheduler"].items()
    assert scheduler_service["spec"]["clusterIP"] == "None"
    assert scheduler_service["spec"]["selector"] == selectors[f"{RELEASE}-scheduler"]
    monitor = only(manifests, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    for service in (api_service, scheduler_service):
        assert monitor.items() <= service["metadata"]["labels"].items()
    budgets = {
        name: obj["spec"]["selector"]["matchLabels"]
        for (kind, name), obj in manifests.items()
        if kind == "PodDisruptionBudget"
    }
    assert budgets == selectors


# --- values schema -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"replicaCount": 0}, "/replicaCount"),
        ({"replicaCount": "3"}, "/replicaCount"),
        ({"logFormat": "pretty"}, "/logFormat"),
        ({"replicacount": 3}, "replicacount"),
        ({"database": {"uri": DSN}}, "uri"),
        ({"shutdownGraceSeconds": 2.5}, "/shutdownGraceSeconds"),
        ({"takeoverSeconds": 0.1}, "/takeoverSeconds"),
        ({"dbLinkTimeoutSeconds": 5}, "/dbLinkTimeoutSeconds"),
        (
            {"jobs": [{"name": "x", "schedule": {"kind": "cron", "expression": "* * * * *"}}]},
            "task",
        ),
        (
            {"jobs": [{"name": "x", "schedule": {"kind": "daily", "at": [300]}, "task": "log"}]},
            "/at/0",
        ),
        ({"jobs": [{"name": "x", "schedule": {"kind": "hourly"}, "task": "log"}]}, "/kind"),
        (
            {
                "jobs": [
                    {
                        "name": "-x",
                        "schedule": {"kind": "once", "at": "2030-01-01T00:00:00Z"},
                        "task": "log",
                    }
                ]
            },
            "/name",
        ),
        ({"jobs": [JOBS[0] | {"state": "paused"}]}, "state"),
    ],
)
def test_schema_rejects_bad_values(
    helm: ModuleType, chart: Any, bad: dict[str, Any], message: str
) -> None:
    values = {"database": {"url": DSN}} | bad
    with pytest.raises(helm.HelmValuesError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] or any(m["severity"] >= 3 for m in report["messages"])


# --- monitoring ----------------------------------------------------------------------------


def test_service_monitor(scenario: Callable[[str], Manifests]) -> None:
    assert [key for key in scenario("defaults") if key[0] == "ServiceMonitor"] == []
    manifests = scenario("monitoring-and-hpa")
    monitor = only(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = only(manifests, "Service")
    spec = monitor["spec"]
    assert spec.keys() <= {"selector", "namespaceSelector", "endpoints"}
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"].endswith("s")
