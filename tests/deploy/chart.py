"""What the chart tests share: the release they render, and readers of rendered objects."""

from typing import Any

from kubernetes_validate import utils as kubernetes_validate

RELEASE = "tickgate"
NAMESPACE = "scheduling"
DSN = "postgresql://tickgate:s3cret@postgres.db.svc:5432/tickgate"
# A current Kubernetes release, and the newest one kubernetes-validate ships schemas for.
KUBE_VERSIONS = ("1.33", kubernetes_validate.latest_version())

Manifests = dict[tuple[str, str], dict[str, Any]]


def only(manifests: Manifests, kind: str) -> dict[str, Any]:
    found = [obj for (k, _), obj in manifests.items() if k == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(manifests: Manifests) -> dict[str, Any]:
    containers = only(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entries = spec.get("env", [])
    names = [entry["name"] for entry in entries]
    assert len(names) == len(set(names)), f"duplicate env entries: {names}"
    return {entry["name"]: entry for entry in entries}


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
