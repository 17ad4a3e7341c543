"""kwok's fake Node: Pods on it become Running and Ready, so Deployments get available replicas.

The ReplicaSet, Deployment and HPA controllers are the real ones; kwok stands in for the
kubelet of one Node (``controlplane/kwok.py``). Pods that name no node stay Pending.
"""

from __future__ import annotations

import ipaddress
import json
import queue
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tinct_testing.controlplane import kwok
from tinct_testing.controlplane.harness import Cluster, ControlPlane
from tinct_testing.release_cluster import apply, cpu_hpa, deployment, get, ready_node, wait_available
from tinct_testing.wait import WAIT, eventually


@pytest.fixture(autouse=True)
def _needs_controllers(cluster: Cluster) -> None:
    if not getattr(cluster, "controllers", False):
        pytest.fail("no kube-controller-manager runs (KUBEBUILDER_ASSETS?); unset it to use the built one")


@pytest.fixture
def node(cluster: Cluster) -> str:
    return ready_node(cluster)


def _pods(cluster: Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


class _Watch:
    """``kubectl get --watch`` of one object's field, each value as it changes, in order."""

    def __init__(self, cluster: Cluster, ns: str, kind: str, name: str, jsonpath: str) -> None:
        self._proc = subprocess.Popen(
            [
                cluster.kubectl_path,
                "--kubeconfig",
                str(cluster.kubeconfig),
                "get",
                kind,
                name,
                "-n",
                ns,
                "--watch",
                "-o",
                # A real newline: each watch event prints one line.
                f"jsonpath={jsonpath}\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line.strip())

    def next(self, timeout: float) -> str | None:
        try:
            value = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        self.seen.append(value)
        return value

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)


@pytest.fixture
def watches() -> Iterator[list[_Watch]]:
    made: list[_Watch] = []
    yield made
    for w in made:
        w.close()


def _node(cluster: Cluster, name: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)
    return got


def test_node_is_ready_and_only_labelled_nodes_are_managed(cluster: Cluster, node: str) -> None:
    if not isinstance(cluster, ControlPlane):
        pytest.fail("this test checks the harness's kwok; unset TINCT_TEST_KUBECONFIG")
    got = _node(cluster, node)
    assert kwok.node_ready(got)
    assert got["metadata"]["labels"][kwok.NODE_LABEL[0]] == kwok.NODE_LABEL[1]
    assert got["status"]["allocatable"] == {"cpu": "1k", "memory": "1Ti", "pods": "10k"}
    assert got["status"]["nodeInfo"]["kubeletVersion"] == "kwok-v0.8.0"
    # Two more Nodes: one with the label (kwok's), one without (left alone).
    suffix = uuid.uuid4().hex[:6]
    labelled, plain = f"kwok-extra-{suffix}", f"plain-{suffix}"
    unlabelled = kwok.node_manifest(plain)
    unlabelled["metadata"]["labels"].pop(kwok.NODE_LABEL[0])
    cluster.kubectl("create", "-f", "-", input=json.dumps(kwok.node_manifest(labelled)))
    cluster.kubectl("create", "-f", "-", input=json.dumps(unlabelled))
    try:
        eventually(
            lambda: kwok.node_ready(_node(cluster, labelled)), timeout=WAIT, what="the labelled Node Ready"
        )
        assert not _node(cluster, plain).get("status", {}).get("conditions")
    finally:
        cluster.kubectl("delete", "node", labelled, plain, "--wait=false")


def test_deployment_on_the_node_gets_three_available_replicas(
    cluster: Cluster, namespace: str, node: str
) -> None:
    apply(cluster, namespace, deployment("web", 3, node=node))
    dep = wait_available(cluster, namespace, "web", 3)
    assert dep["status"]["readyReplicas"] == 3
    pods = _pods(cluster, namespace, "app=web")
    assert len(pods) == 3
    for pod in pods:
        assert pod["spec"]["nodeName"] == node
        assert pod["status"]["phase"] == "Running"
        assert _ready(pod)
        assert pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(kwok.POD_CIDR)
    assert len({p["status"]["podIP"] for p in pods}) == 3


def test_scaling_up_adds_available_replicas(cluster: Cluster, namespace: str, node: str) -> None:
    apply(cluster, namespace, deployment("web", 3, node=node))
    wait_available(cluster, namespace, "web", 3)
    cluster.kubectl("scale", "deployment", "web", "-n", namespace, "--replicas=5")
    dep = wait_available(cluster, namespace, "web", 5)
    assert dep["spec"]["replicas"] == 5
    assert sum(_ready(p) for p in _pods(cluster, namespace, "app=web")) == 5


def test_hpa_min_replicas_raises_the_deployment_and_the_new_pods_become_available(
    cluster: Cluster, namespace: str, node: str
) -> None:
    apply(cluster, namespace, deployment("web", 1, node=node))
    wait_available(cluster, namespace, "web", 1)
    # No metrics API serves CPU here: the HPA cannot compute a replica count, yet it still
    # lifts the target to minReplicas.
    apply(cluster, namespace, cpu_hpa("web", "web", 4, 6, utilization=50))
    dep = wait_available(cluster, namespace, "web", 4)
    assert dep["spec"]["replicas"] == 4

    def hpa_status() -> dict[str, Any] | None:
        got = get(cluster, namespace, "hpa", "web") or {}
        st: dict[str, Any] = got.get("status") or {}
        conditions = {c["type"]: c for c in st.get("conditions", [])}
        return st if st.get("currentReplicas") == 4 and "ScalingActive" in conditions else None

    st = eventually(hpa_status, timeout=WAIT, what="the HPA's status")
    assert st["desiredReplicas"] == 4
    # The replicas come from minReplicas, not from a metric.
    active = next(c for c in st["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "FailedGetResourceMetric")


def test_deleting_a_pod_drops_availability_then_a_replacement_restores_it(
    cluster: Cluster, namespace: str, node: str, watches: list[_Watch]
) -> None:
    apply(cluster, namespace, deployment("web", 3, node=node))
    wait_available(cluster, namespace, "web", 3)
    before = {p["metadata"]["name"] for p in _pods(cluster, namespace, "app=web")}
    # Watched, not polled: the gap lasts only as long as the replacement takes to be Ready.
    available = _Watch(cluster, namespace, "deployment", "web", "{.status.availableReplicas}")
    watches.append(available)
    assert available.next(timeout=30) == "3"
    victim = sorted(before)[0]
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")

    dropped = False

    def dropped_and_recovered() -> bool:
        nonlocal dropped
        value = available.next(timeout=1)  # blocks until the watch says something, or 1 s
        # An empty value is 0: the field is left out then.
        dropped = dropped or (value is not None and int(value or 0) < 3)
        return dropped and value == "3"

    eventually(
        dropped_and_recovered,
        timeout=60,
        interval=0,
        what="availableReplicas to drop and recover",
        explain=lambda: f"values seen: {available.seen}",
    )
    after = {p["metadata"]["name"] for p in _pods(cluster, namespace, "app=web")}
    assert victim not in after
    assert len(after) == 3
    assert len(after - before) == 1
    wait_available(cluster, namespace, "web", 3)


def test_pods_that_name_no_node_stay_pending(cluster: Cluster, namespace: str, node: str) -> None:
    apply(cluster, namespace, deployment("idle", 2, ready=False), deployment("witness", 1, node=node))
    # Once kwok has made the witness Ready, it has seen this namespace's Pods.
    wait_available(cluster, namespace, "witness", 1)
    idle = eventually(
        lambda: len(_pods(cluster, namespace, "app=idle")) == 2,
        timeout=WAIT,
        what="the idle Deployment's two Pods",
    )
    assert idle
    for pod in _pods(cluster, namespace, "app=idle"):
        assert pod["status"]["phase"] == "Pending"
        assert not pod["spec"].get("nodeName")
        assert not _ready(pod)
    dep = get(cluster, namespace, "deployment", "idle")
    assert dep is not None
    assert dep["status"].get("availableReplicas", 0) == 0


def test_without_kwok_the_helpers_say_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cp = ControlPlane(with_kwok=False)
    try:
        assert cp.kwok_node is None
        with pytest.raises(AssertionError, match="TINCT_TEST_KWOK_NODE"):
            ready_node(cp)
        with pytest.raises(AssertionError, match="no Node here makes Pods Ready"):
            wait_available(cp, "any", "web", 1)
    finally:
        cp.stop()
    # KUBEBUILDER_ASSETS: kwok only when that directory has one; nothing is built.
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    assert kwok.default_binary() is None
    (tmp_path / "kwok").write_text("")
    assert kwok.default_binary() == tmp_path / "kwok"
