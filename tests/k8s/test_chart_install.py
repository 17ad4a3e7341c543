"""``helm install`` / ``upgrade`` / ``uninstall`` of charts/tinct on the real API server.

No kubelet runs here, so the Deployments never get Pods: the tests assert what the API
server holds after each helm command, and that the CRDs and the custom resources outlive
the release.
"""

from __future__ import annotations

import json
from typing import Any

from tinct_testing.chart_helpers import CHART
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.helm import Helm

ALL_CRDS = (
    "modelversions.tinct.io",
    "grayreleases.tinct.io",
    "kopfpeerings.kopf.dev",
    "clusterkopfpeerings.kopf.dev",
)
MV = {
    "apiVersion": "tinct.io/v1alpha1",
    "kind": "ModelVersion",
    "metadata": {"name": "kept"},
    "spec": {"model": "m", "version": "1.0.0", "artifacts": [{"format": "ptx", "uri": "file:///k.ptx"}]},
}


def _get(cluster: Cluster, *args: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    if proc.returncode != 0:
        assert "NotFound" in proc.stderr, proc.stderr
        return None
    obj: dict[str, Any] = json.loads(proc.stdout)
    return obj


def _release(namespace: str, prefix: str) -> str:
    return f"{prefix}-{namespace[-6:]}"  # cluster-scoped names stay unique per test


def test_install_upgrade_uninstall(helm: Helm, cluster: Cluster, namespace: str) -> None:
    rel = _release(namespace, "inst")
    out = helm("install", rel, str(CHART), "--namespace", namespace).stdout
    assert "STATUS: deployed" in out
    assert f"http://{rel}-tinct-router.{namespace}.svc:80" in out, "NOTES tell where the router is"
    for crd in ALL_CRDS:
        assert _get(cluster, "crd", crd) is not None, f"{crd} installed from the chart's crds/"
    op = _get(cluster, "deployment", f"{rel}-tinct-operator", "-n", namespace)
    assert op is not None
    assert op["spec"]["template"]["spec"]["serviceAccountName"] == f"{rel}-tinct-operator"
    assert _get(cluster, "hpa", f"{rel}-tinct-router", "-n", namespace) is not None
    assert _get(cluster, "pdb", f"{rel}-tinct-router", "-n", namespace) is not None
    assert _get(cluster, "service", f"{rel}-tinct-router", "-n", namespace) is not None
    role = _get(cluster, "clusterrole", f"{rel}-tinct-operator")
    assert role is not None
    assert _get(cluster, "rolebinding", f"{rel}-tinct-router", "-n", namespace) is not None, (
        "tables: chart namespace only"
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(MV))

    helm(
        "upgrade",
        rel,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "router.autoscaling.enabled=false",
        "--set",
        "router.replicas=3",
        "--set",
        "operator.hashWorkers=8",
    )
    router = _get(cluster, "deployment", f"{rel}-tinct-router", "-n", namespace)
    assert router is not None
    assert router["spec"]["replicas"] == 3
    assert _get(cluster, "hpa", f"{rel}-tinct-router", "-n", namespace) is None, "HPA removed on upgrade"
    op = _get(cluster, "deployment", f"{rel}-tinct-operator", "-n", namespace)
    assert op is not None
    assert "--hash-workers=8" in op["spec"]["template"]["spec"]["containers"][0]["args"]
    history = json.loads(helm("history", rel, "-n", namespace, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2]

    out = helm("uninstall", rel, "--namespace", namespace).stdout
    assert f"{rel}-tinct-lineage" in out, "the lineage PVC is kept by its resource policy"
    assert _get(cluster, "deployment", f"{rel}-tinct-operator", "-n", namespace) is None
    assert _get(cluster, "clusterrole", f"{rel}-tinct-operator") is None
    for crd in ALL_CRDS:
        assert _get(cluster, "crd", crd) is not None, f"{crd} kept on uninstall"
    assert _get(cluster, "modelversion", "kept", "-n", namespace) is not None, "custom resources survive"
    assert _get(cluster, "pvc", f"{rel}-tinct-lineage", "-n", namespace) is not None


def test_crds_as_release_resources_are_kept_on_uninstall(
    helm: Helm, cluster: Cluster, namespace: str
) -> None:
    rel = _release(namespace, "crds")
    # The crds fixture installed the CRDs with kubectl, so the release adopts them.
    args = ["--namespace", namespace, "--set", "crds.enabled=true", "--set", "router.enabled=false"]
    helm("install", rel, str(CHART), "--skip-crds", "--take-ownership", *args)
    crd = _get(cluster, "crd", "modelversions.tinct.io")
    assert crd is not None
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == rel
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(MV))
    helm("upgrade", rel, str(CHART), "--skip-crds", *args)

    out = helm("uninstall", rel, "--namespace", namespace).stdout
    assert "kept due to the resource policy" in out
    for name in ALL_CRDS:
        assert name in out
        assert _get(cluster, "crd", name) is not None, f"{name} kept on uninstall"
    assert _get(cluster, "modelversion", "kept", "-n", namespace) is not None
