"""The kube-controller-manager the harness starts: the controllers tinct relies on act.

No scheduler or kubelet runs, so Pods that name no node stay Pending; everything up to
that is real. (Pods on kwok's fake Node become Ready: test_kwok.py.)
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.paths import EXAMPLES
from tinct_testing.wait import eventually


@pytest.fixture(autouse=True)
def _needs_controllers(cluster: Cluster) -> None:
    if not getattr(cluster, "controllers", False):
        pytest.fail(
            "no kube-controller-manager runs: its binary is missing from the control plane's "
            "bin dir (KUBEBUILDER_ASSETS?); unset KUBEBUILDER_ASSETS to use the built one"
        )


def _get(cluster: Cluster, *args: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    if proc.returncode != 0:
        if "NotFound" in proc.stderr or "not found" in proc.stderr:
            return None
        raise AssertionError(proc.stderr)
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _owned_configmap(namespace: str, name: str, owner: dict[str, Any]) -> str:
    meta = owner["metadata"]
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": {"k": "v"},
        }
    )


def test_configmap_owned_by_a_grayrelease_is_collected_with_it(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "grayrelease.yaml"))
    owner = _get(cluster, "grayrelease", "chat", "-n", namespace)
    assert owner is not None
    cluster.kubectl("create", "-f", "-", input=_owned_configmap(namespace, "chat-table", owner))
    # A bystander with no owner stays.
    cluster.kubectl("create", "configmap", "bystander", "-n", namespace)
    assert _get(cluster, "configmap", "chat-table", "-n", namespace) is not None

    cluster.kubectl("delete", "grayrelease", "chat", "-n", namespace, "--wait=false")
    eventually(
        lambda: _get(cluster, "configmap", "chat-table", "-n", namespace) is None,
        timeout=60,
        what="the owned ConfigMap garbage-collected",
    )
    assert _get(cluster, "grayrelease", "chat", "-n", namespace) is None
    assert _get(cluster, "configmap", "bystander", "-n", namespace) is not None


def test_foreground_deletion_waits_for_the_dependents(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = _get(cluster, "configmap", "owner", "-n", namespace)
    assert owner is not None
    cluster.kubectl("create", "-f", "-", input=_owned_configmap(namespace, "dependent", owner))
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=foreground")
    # --cascade=foreground returns once the owner is gone, which the GC allows only after
    # the dependent (blockOwnerDeletion) is gone.
    assert _get(cluster, "configmap", "dependent", "-n", namespace) is None
    assert _get(cluster, "configmap", "owner", "-n", namespace) is None


def test_namespace_deletion_finishes(cluster: Cluster) -> None:
    name = f"doomed-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("create", "configmap", "content", "-n", name)
    # The namespace's own controllers run: the default ServiceAccount and the root CA.
    eventually(
        lambda: _get(cluster, "serviceaccount", "default", "-n", name),
        timeout=60,
        what="the default ServiceAccount",
    )
    ca = eventually(
        lambda: _get(cluster, "configmap", "kube-root-ca.crt", "-n", name),
        timeout=60,
        what="kube-root-ca.crt",
    )
    assert "BEGIN CERTIFICATE" in ca["data"]["ca.crt"]

    cluster.kubectl("delete", "namespace", name, "--wait=false")
    eventually(lambda: _get(cluster, "namespace", name) is None, timeout=60, what="the namespace gone")


def test_deployment_gets_its_replicaset_and_pending_pods(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "create", "deployment", "web", "-n", namespace, "--image=registry.invalid/web:1", "--replicas=2"
    )

    def replicaset() -> dict[str, Any] | None:
        rs = _get(cluster, "replicasets", "-n", namespace, "-l", "app=web")
        return rs["items"][0] if rs and rs["items"] else None

    rs = eventually(replicaset, timeout=60, what="a ReplicaSet for the Deployment")
    [ref] = rs["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"]) == ("Deployment", "web")

    def pods() -> list[dict[str, Any]]:
        got = _get(cluster, "pods", "-n", namespace, "-l", "app=web")
        return got["items"] if got and len(got["items"]) == 2 else []

    made = eventually(pods, timeout=60, what="the ReplicaSet's two Pods")
    # No scheduler: created, never placed.
    assert {p["status"].get("phase") for p in made} == {"Pending"}
    assert all(not p["spec"].get("nodeName") for p in made)
    deployment = eventually(
        lambda: (
            (d := _get(cluster, "deployment", "web", "-n", namespace)) and d["status"].get("replicas") and d
        ),
        timeout=60,
        what="the Deployment status",
    )
    assert deployment["status"]["replicas"] == 2
    assert deployment["status"].get("readyReplicas", 0) == 0


def test_hpa_gets_status_from_its_controller(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "deployment", "web", "-n", namespace, "--image=registry.invalid/web:1")
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "web", "namespace": namespace},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                    "minReplicas": 1,
                    "maxReplicas": 3,
                    "metrics": [
                        {
                            "type": "Pods",
                            "pods": {
                                "metric": {"name": "http_requests_total"},
                                "target": {"type": "AverageValue", "averageValue": "10"},
                            },
                        }
                    ],
                },
            }
        ),
    )

    def conditions() -> dict[str, dict[str, str]]:
        hpa = _get(cluster, "hpa", "web", "-n", namespace)
        assert hpa is not None
        found = {c["type"]: c for c in hpa.get("status", {}).get("conditions", [])}
        return found if {"AbleToScale", "ScalingActive"} <= set(found) else {}

    found = eventually(conditions, timeout=60, what="HPA conditions")
    assert found["AbleToScale"]["status"] == "True"
    # No custom metrics API serves http_requests_total here: the controller says so.
    assert found["ScalingActive"]["status"] == "False"
    assert found["ScalingActive"]["reason"] == "FailedGetPodsMetric"


def test_each_controller_acts_as_its_own_service_account(cluster: Cluster) -> None:
    """--use-service-account-credentials: the bootstrap roles, not one all-powerful identity."""
    wanted = {
        "generic-garbage-collector",
        "namespace-controller",
        "deployment-controller",
        "replicaset-controller",
        "horizontal-pod-autoscaler",
    }

    def accounts() -> set[str]:
        got = _get(cluster, "serviceaccounts", "-n", "kube-system")
        names = {sa["metadata"]["name"] for sa in (got or {}).get("items", [])}
        return names if wanted <= names else set()

    eventually(accounts, timeout=60, what="the controllers' ServiceAccounts in kube-system")
