"""What the chart tests share: the release they render, and readers of rendered objects."""

from typing import Any

from kubernetes_validate import utils as kubernetes_validate

RELEASE = "tickgate"
NAMESPACE = "scheduling"
DSN = "postgresql://tickgate:s3cret@postgres.db.svc:5432/tickgate"
# A current Kubernetes release, and the newest one kubernetes-validate ships schemas for.
KUBE_VERSIONS = ("1.33", kubernetes_validate.latest_version())

Manifests = dict[tuple[str, str], dict[str, Any]]

# Kinds of CustomResourceDefinitions, which kubernetes-validate has no schemas for: the
# tests check their shape field by field instead.
CUSTOM_KINDS = frozenset({"ServiceMonitor", "PrometheusRule", "HTTPRoute"})

POSTGRES_PEER = {"ipBlock": {"cidr": "10.30.0.5/32"}}
# Every optional object of the chart at once.
EVERYTHING_ON: dict[str, Any] = {
    "database": {"url": DSN},
    "schedulerDeployment": {"enabled": True},
    "migrations": {"hookJob": {"enabled": True}},
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "helmTest": {"enabled": True},
    "ingress": {
        "enabled": True,
        "className": "nginx",
        "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
        "tls": [{"secretName": "tickgate-tls", "hosts": ["tickgate.example.com"]}],
    },
    "httpRoute": {
        "enabled": True,
        "parentRefs": [{"name": "public", "namespace": "gateway-system", "sectionName": "https"}],
        "hostnames": ["tickgate.example.com"],
    },
    "networkPolicy": {
        "enabled": True,
        "ingressFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}
        ],
        "postgresql": {"to": [POSTGRES_PEER]},
        "egress": [
            {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"], "ports": [443]},
            {"cidr": "10.20.0.0/16", "ports": [80, 8080]},
        ],
    },
    "tasks": {
        "modules": ["acme_tasks.billing", "acme_tasks.reports"],
        "http": {"allow": ["10.20.0.0/16", "reports.internal"]},
        "sql": {"existingSecret": "sql-targets", "allowSelf": True},
    },
    "tracing": {"otlpEndpoint": "http://otel-collector.observability:4318", "sampleRatio": 0.25},
    "hooks": {
        "defaults": [
            {
                "on": ["failure"],
                "action": {"kind": "http", "args": {"url": "https://alerts.example.com/tg"}},
            }
        ]
    },
    "publicUrl": "https://tickgate.example.com",
}


def only(manifests: Manifests, kind: str) -> dict[str, Any]:
    found = [obj for (k, _), obj in manifests.items() if k == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(manifests: Manifests) -> dict[str, Any]:
    """The container of the main Deployment's pods."""
    containers = manifests[("Deployment", RELEASE)]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entries = spec.get("env", [])
    names = [entry["name"] for entry in entries]
    assert len(names) == len(set(names)), f"duplicate env entries: {names}"
    return {entry["name"]: entry for entry in entries}


def secret_file(pod: dict[str, Any], setting: str) -> dict[str, str]:
    """The Secret and key that the pod's (first) container reads as the file the setting
    `setting` names: mounted read-only from a Secret volume, as
    `{"name": <Secret>, "key": <key>}` (the shape of an env var's secretKeyRef)."""
    main = pod["containers"][0]
    path = env_of(main)[setting]["value"]
    directory, _, filename = path.rpartition("/")
    (mount,) = [m for m in main["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (item,) = [i for i in volume["secret"]["items"] if i["path"] == filename]
    return {"name": volume["secret"]["secretName"], "key": item["key"]}


def pod_spec(manifests: Manifests) -> dict[str, Any]:
    """The pod spec of the main Deployment."""
    pod: dict[str, Any] = manifests[("Deployment", RELEASE)]["spec"]["template"]["spec"]
    return pod


def named_port(spec: dict[str, Any], name: str) -> int:
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    return ports[name]


def pod_annotations(manifests: Manifests) -> dict[str, str]:
    annotations: dict[str, str] = only(manifests, "Deployment")["spec"]["template"]["metadata"][
        "annotations"
    ]
    return annotations


def validate_kubernetes(obj: dict[str, Any]) -> None:
    """Against the OpenAPI schemas of each Kubernetes version tested (core kinds only)."""
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)
