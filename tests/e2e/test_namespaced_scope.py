"""The chart in namespaced scope on the real node: install, restricted Pods, upgrade, uninstall.

The chart's defaults where a user keeps them: one operator on a ReadWriteOnce PVC (bound
to the node's static PV), the routers behind their Service. What runs is checked inside
the containers: the user, the read-only root, no capabilities, seccomp, no new
privileges, a ServiceAccount token; the operator proves its token and RBAC by driving a
ModelVersion to Ready and writing the lineage, which is read here from the volume.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from tinct.lineage.sql import query
from tinct_testing.chart_helpers import CHART
from tinct_testing.controlplane.harness import ControlPlane
from tinct_testing.controlplane.helm import Helm
from tinct_testing.controlplane.images import Image
from tinct_testing.controlplane.node import Node
from tinct_testing.lineage_artifacts import make_onnx, sha256_file
from tinct_testing.modelversion_cluster import mv_doc
from tinct_testing.node_cluster import get_json, node_namespace, pods, values, wait_for, wait_ready

RELEASE = "ns"
FULL = f"{RELEASE}-tinct"
ROUTERS = "app.kubernetes.io/component=router"
OPERATORS = "app.kubernetes.io/component=operator"

# Run inside a container: what the process is allowed, as JSON.
INSIDE = """\
import json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
try:
    open("/written-by-e2e", "w")
    root = "writable"
except OSError as e:
    root = e.strerror
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "root": root,
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "seccomp": status["Seccomp"].strip(),
    "token": os.path.getsize("/var/run/secrets/kubernetes.io/serviceaccount/token") > 0,
}))
"""


def inside(cluster: ControlPlane, ns: str, pod: str, container: str) -> dict[str, Any]:
    out = cluster.kubectl("exec", pod, "-n", ns, "-c", container, "--", "python", "-c", INSIDE).stdout
    found: dict[str, Any] = json.loads(out)
    return found


def modelversion(name: str, version: str, sha256: str) -> dict[str, Any]:
    return mv_doc(
        name, [{"format": "onnx", "uri": "file:///models/model.onnx", "sha256": sha256}], version=version
    )


def phase(cluster: ControlPlane, ns: str, name: str) -> str | None:
    found: str | None = (get_json(cluster, "mv", name, "-n", ns).get("status") or {}).get("phase")
    return found


def lineage(cluster: ControlPlane, ns: str) -> list[dict[str, Any]]:
    pvc = get_json(cluster, "pvc", f"{FULL}-lineage", "-n", ns)
    root = get_json(cluster, "pv", pvc["spec"]["volumeName"])["spec"]["hostPath"]["path"]
    rows: list[dict[str, Any]] = query(
        "SELECT name, version, event FROM model_versions ORDER BY version, event", root
    ).to_pylist()
    return rows


def test_namespaced_install_upgrade_uninstall_keep_lineage(
    node: Node, node_cluster: ControlPlane, node_helm: Helm, tinct_image: Image, tmp_path: Path
) -> None:
    cluster = node_cluster
    ns = node_namespace(cluster, "tinct-namespaced")
    onnx = make_onnx(tmp_path / "model.onnx")
    models = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "models"},
        "binaryData": {"model.onnx": base64.b64encode(onnx.read_bytes()).decode()},
    }
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(models))
    args = values(
        tinct_image,
        scope="namespaced",
        **{
            "operator.artifactRoots": [
                {"name": "models", "mountPath": "/models", "volume": {"configMap": {"name": "models"}}}
            ]
        },
    )
    try:
        node_helm("install", RELEASE, str(CHART), "-n", ns, "--wait", "--timeout", "5m", *args, timeout=600)
        (op,) = wait_ready(cluster, ns, OPERATORS, 1)
        routers = wait_ready(cluster, ns, ROUTERS, 2)
        assert {p["spec"]["nodeName"] for p in [op, *routers]} == {node.name}

        # The restricted security context, as the kernel applies it.
        for pod, container in [(op, "operator"), (routers[0], "router")]:
            got = inside(cluster, ns, pod["metadata"]["name"], container)
            assert got == {
                "uid": 10001,
                "gid": 10001,
                "root": "Read-only file system",
                "cap_eff": "0000000000000000",
                "no_new_privs": "1",
                "seccomp": "2",
                "token": True,
            }, (container, got)

        sha = sha256_file(onnx)
        cluster.kubectl(
            "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(modelversion("m-1-0-0", "1.0.0", sha))
        )
        wait_for(cluster, ns, "m-1-0-0 Ready", lambda: phase(cluster, ns, "m-1-0-0") == "Ready")
        recorded = lineage(cluster, ns)
        assert [(r["version"], r["event"]) for r in recorded] == [("1.0.0", "registered")]

        node_helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            ns,
            "--wait",
            "--timeout",
            "5m",
            *args,
            "--set",
            "operator.hashWorkers=2",
            timeout=600,
        )
        (op2,) = wait_ready(cluster, ns, OPERATORS, 1)
        assert op2["metadata"]["name"] != op["metadata"]["name"], "the upgrade replaced the operator"
        assert "--hash-workers=2" in op2["spec"]["containers"][0]["args"]
        assert phase(cluster, ns, "m-1-0-0") == "Ready"
        assert lineage(cluster, ns) == recorded

        node_helm("uninstall", RELEASE, "-n", ns, "--wait", timeout=300)
        wait_for(
            cluster,
            ns,
            "the chart's Pods gone",
            lambda: not pods(cluster, ns, "app.kubernetes.io/name=tinct"),
        )
        for crd in ("modelversions.tinct.io", "grayreleases.tinct.io", "kopfpeerings.kopf.dev"):
            cluster.kubectl("get", "crd", crd)
        assert phase(cluster, ns, "m-1-0-0") == "Ready"
        assert lineage(cluster, ns) == recorded

    finally:
        node_helm("uninstall", RELEASE, "-n", ns, "--wait", check=False, timeout=300)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
