"""The chart in cluster scope on the real node: releases, a failover, a router rollout, uninstall.

``helm install --wait`` of charts/tinct from the image built here, as a user would: two
operator replicas (kopf peering) on a ReadWriteMany PVC bound to the node's static PV,
the router fleet behind its Service with its HPA on metrics-server's CPU figures, the
operator reading the harness's Prometheus, which scrapes the router Pods by IP. The
stable and candidate backends are engine emulators (``tinct emulator``, same image) as
Deployments behind Services, reached by the routers through cluster DNS. Traffic goes
from this machine to the router Service's ClusterIP (kube-proxy). The tests run in order
on one install.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tinct.lineage.sql import query
from tinct_testing.chart_helpers import CHART
from tinct_testing.controlplane.harness import ControlPlane
from tinct_testing.controlplane.helm import Helm
from tinct_testing.controlplane.images import Image
from tinct_testing.controlplane.node import Node
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.lineage_artifacts import make_onnx, sha256_file
from tinct_testing.modelversion_cluster import mv_doc
from tinct_testing.node_cluster import (
    Load,
    PodTargets,
    backend,
    cluster_ip,
    get_json,
    node_namespace,
    pods,
    values,
    wait_for,
    wait_ready,
    wait_served,
)
from tinct_testing.release_cluster import apply

RELEASE = "e2e"
FULL = f"{RELEASE}-tinct"
ROUTERS = "app.kubernetes.io/component=router"
OPERATORS = "app.kubernetes.io/component=operator"
TINCT = str(Path(sys.executable).parent / "tinct")


@dataclass
class Install:
    ns: str
    tenant: str
    router_ip: str
    prom: Prometheus
    image: Image
    args: list[str]


def _models_configmap(tmp: Path) -> dict[str, Any]:
    onnx = make_onnx(tmp / "model.onnx")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "e2e-models"},
        "binaryData": {"model.onnx": base64.b64encode(onnx.read_bytes()).decode()},
    }


def modelversion(model: str, version: str, sha256: str) -> dict[str, Any]:
    artifacts = [{"format": "onnx", "uri": "file:///models/model.onnx", "sha256": sha256}]
    return mv_doc(f"{model}-{version.replace('.', '-')}", artifacts, version=version, model=model)


def gray_release(name: str, model: str, stable: str, candidate: str, *, failure_limit: int) -> dict[str, Any]:
    def side(svc: str, version: str, scheduler: str) -> dict[str, Any]:
        return {
            "modelVersion": f"{model}-{version.replace('.', '-')}",
            "service": svc,
            "port": 8000,
            "deployment": svc,
            "schedulerVersion": scheduler,
        }

    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "GrayRelease",
        "metadata": {"name": name},
        "spec": {
            "stable": side(stable, "1.0.0", "v1"),
            "candidate": side(candidate, "1.0.1", "v2"),
            "dye": {
                "promptLength": {"buckets": [{"name": "short", "maxTokens": 512}, {"name": "long"}]},
                "role": {"header": "X-User-Role", "values": ["user"], "default": "user"},
                "latency": {"header": "X-Latency-Class", "values": ["low"], "default": "low"},
                "stickyKey": {"header": "X-Session-Id"},
            },
            "cells": [{"match": {}, "weights": [20, 60, 100]}],
            "analysis": {
                "interval": "5s",
                "failureLimit": failure_limit,
                "minRequests": 5,
                "inconclusiveLimit": 30,
                "prometheus": {},
                "metrics": [{"name": "success-rate", "min": 99}],
            },
            "fallback": {"consecutiveFailures": 3, "latencyMs": 5000, "cooldownSeconds": 5},
            # CPU from metrics-server: the HPA controller really computes these.
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "metric": {"pods": "cpu", "averageValue": "900m"},
            },
        },
    }


def status(cluster: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    st: dict[str, Any] = get_json(cluster, "grayrelease", name, "-n", ns).get("status") or {}
    return st


def lineage_root(cluster: ControlPlane, ns: str) -> Path:
    """Where the operator's lineage PVC lives on this machine (its static hostPath PV)."""
    pvc = get_json(cluster, "pvc", f"{FULL}-lineage", "-n", ns)
    pv = get_json(cluster, "pv", pvc["spec"]["volumeName"])
    return Path(pv["spec"]["hostPath"]["path"])


def history(cluster: ControlPlane, ns: str, release: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = query(
        f"SELECT event_id, step, state, reason FROM release_events WHERE release = '{release}' "
        "ORDER BY recorded_at, event_id",
        str(lineage_root(cluster, ns)),
    ).to_pylist()
    return rows


def release_status_text(cluster: ControlPlane, ns: str, name: str) -> str:
    proc = subprocess.run(
        [
            TINCT,
            "release",
            "status",
            name,
            "-n",
            ns,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--color",
            "never",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def active_operator(cluster: ControlPlane, ns: str) -> str | None:
    """The replica that acts: the live peer of the highest priority in the ClusterKopfPeering."""
    proc = cluster.kubectl("get", "clusterkopfpeering", "tinct", "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    peers: dict[str, dict[str, Any]] = json.loads(proc.stdout).get("status") or {}
    alive = {
        p["metadata"]["name"] for p in pods(cluster, ns, OPERATORS) if p["status"].get("phase") == "Running"
    }
    ranked = sorted((v.get("priority", 0), k) for k, v in peers.items() if k in alive)
    return ranked[-1][1] if ranked else None


@pytest.fixture(scope="module")
def install(
    node: Node,
    node_cluster: ControlPlane,
    node_helm: Helm,
    node_prometheus: Prometheus,
    tinct_image: Image,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    cluster = node_cluster
    ns, tenant = node_namespace(cluster, "tinct"), node_namespace(cluster, "llm")
    tmp = tmp_path_factory.mktemp("cluster-scope")
    models = _models_configmap(tmp)
    digest = sha256_file(tmp / "model.onnx")
    apply(cluster, ns, models)
    docs = [
        *backend("a-v1", tinct_image, "a-v1"),
        *backend("a-v2", tinct_image, "a-v2"),
        *backend("b-v1", tinct_image, "b-v1"),
        *backend("b-v2", tinct_image, "b-v2", fail=True),
        *(modelversion(m, v, digest) for m in ("chat-a", "chat-b") for v in ("1.0.0", "1.0.1")),
    ]
    args = values(
        tinct_image,
        **{
            "operator.replicas": 2,
            "operator.lineage.persistence.accessModes": ["ReadWriteMany"],
            "operator.artifactRoots": [
                {"name": "models", "mountPath": "/models", "volume": {"configMap": {"name": "e2e-models"}}}
            ],
            "operator.prometheus.url": node_prometheus.url,
        },
    )
    print(f"\nnode bring-up: {node.timings}")
    try:
        node_helm("install", RELEASE, str(CHART), "-n", ns, "--wait", "--timeout", "5m", *args, timeout=600)
        apply(cluster, tenant, *docs)
        with PodTargets(cluster, ns, ROUTERS, 9090, node_prometheus):
            yield Install(
                ns, tenant, cluster_ip(cluster, ns, f"{FULL}-router"), node_prometheus, tinct_image, args
            )
    finally:
        node_helm("uninstall", RELEASE, "-n", ns, "--wait", check=False, timeout=300)
        for name in (tenant, ns):
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_install_runs_every_pod_ready_on_the_node(
    install: Install, node: Node, node_cluster: ControlPlane
) -> None:
    cluster = node_cluster
    operators = wait_ready(cluster, install.ns, OPERATORS, 2)
    # The router HPA raises the Deployment to its minimum (2) on its own.
    routers = wait_ready(cluster, install.ns, ROUTERS, 2)
    for p in operators + routers:
        assert p["spec"]["nodeName"] == node.name
        assert p["spec"]["containers"][0]["image"] == install.image.ref
    for app in ("a-v1", "a-v2", "b-v1", "b-v2"):
        wait_ready(cluster, install.tenant, f"app={app}", 1)
    # Both ModelVersions of each release become Ready: the operator Pod read the artifact
    # from its mounted root and recorded it in the lineage PVC.
    for m in ("chat-a", "chat-b"):
        for v in ("1-0-0", "1-0-1"):
            wait_for(
                cluster,
                install.tenant,
                f"ModelVersion {m}-{v} Ready",
                lambda m=m, v=v: (
                    (get_json(cluster, "mv", f"{m}-{v}", "-n", install.tenant).get("status") or {}).get(
                        "phase"
                    )
                    == "Ready"
                ),
            )
    print("\n" + cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout)
    # metrics-server gives the router HPA its CPU figure.
    wait_for(
        cluster,
        install.ns,
        "the router HPA to read CPU from metrics.k8s.io",
        lambda: (get_json(cluster, "hpa", f"{FULL}-router", "-n", install.ns).get("status") or {}).get(
            "currentMetrics"
        ),
    )


@contextmanager
def _under_load(
    install: Install, cluster: ControlPlane, name: str, side: str, failure_limit: int
) -> Iterator[Load]:
    """Release ``name`` (of the model of that name, from ``side``-v1 to ``side``-v2) once served,
    with clients sending it requests for the block; what they got is printed after."""
    apply(
        cluster,
        install.tenant,
        gray_release(name, name, f"{side}-v1", f"{side}-v2", failure_limit=failure_limit),
    )
    # Until its first table is in force, the routers answer 503 (no table) for the model.
    wait_served(cluster, install.tenant, install.router_ip, 80, name)
    with Load(install.router_ip, 80, name) as load:
        yield load
    print(f"\nrequests during the release: {dict(load.outcomes)}")
    print(release_status_text(cluster, install.tenant, name))


def _in_phase(cluster: ControlPlane, tenant: str, name: str, phase: str) -> dict[str, Any]:
    """Release ``name``'s status once in ``phase``."""
    st: dict[str, Any] = wait_for(
        cluster,
        tenant,
        f"{name} {phase}",
        lambda: (s := status(cluster, tenant, name)).get("phase") == phase and s,
    )
    return st


def test_release_steps_to_promoted_though_the_active_operator_is_deleted(
    install: Install, node_cluster: ControlPlane
) -> None:
    cluster, tenant = node_cluster, install.tenant
    with _under_load(install, cluster, "chat-a", "a", failure_limit=2) as load:
        wait_for(
            cluster, tenant, "chat-a at step 1", lambda: status(cluster, tenant, "chat-a").get("step", 0) >= 1
        )
        first = wait_for(
            cluster, install.ns, "the active operator", lambda: active_operator(cluster, install.ns)
        )
        cluster.kubectl("delete", "pod", first, "-n", install.ns)
        second = wait_for(
            cluster,
            install.ns,
            "another replica to act",
            lambda: (a := active_operator(cluster, install.ns)) not in (None, first) and a,
        )
        st = _in_phase(cluster, tenant, "chat-a", "Promoted")
        wait_for(cluster, tenant, "v2 answering", lambda: load.outcomes["200 v2"] > 0)
    log = cluster.kubectl("logs", second, "-n", install.ns, "-c", "operator").stdout
    assert f"[{tenant}/chat-a] Promoted" in log, "the replica that took over finished the release"
    # One history across both replicas: started once, each step advanced once and in order,
    # promoted last, nothing recorded twice. A step may be held meanwhile (a Pending row,
    # e.g. while the candidate's new replica starts): holding is not restarting.
    rows = history(cluster, install.ns, "chat-a")
    moves = [(r["reason"].split(":")[0], r["step"]) for r in rows if r["state"] != "Pending"]
    assert [m for m in moves if m[0] in ("Started", "StepAdvanced", "Promoted")] == [
        ("Started", 1),
        ("StepAdvanced", 2),
        ("Promoted", 3),
    ], rows
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows), rows
    assert rows[-1]["state"] == "Promoted", rows
    assert len({r["event_id"] for r in rows}) == len(rows), rows
    assert st["phase"] == "Promoted"
    # Every client request was answered: by v1, by v2, never an error.
    assert set(load.outcomes) <= {"200 v1", "200 v2"}, dict(load.outcomes)


def test_failing_candidate_rolls_back_and_no_client_sees_it(
    install: Install, node_cluster: ControlPlane
) -> None:
    cluster, tenant = node_cluster, install.tenant
    with _under_load(install, cluster, "chat-b", "b", failure_limit=1) as load:
        st = _in_phase(cluster, tenant, "chat-b", "RolledBack")
    rows = history(cluster, install.ns, "chat-b")
    assert rows[-1]["state"] == "RolledBack"
    assert [r["reason"].split(":")[0] for r in rows].count("Started") == 1
    assert all(w == 0 for w in st["weights"].values()), st["weights"]
    # The candidate answered 503; each such request went to v1 in the same request.
    assert set(load.outcomes) == {"200 v1"}, dict(load.outcomes)


def test_router_rollout_under_steady_traffic_loses_no_request(
    install: Install, node_cluster: ControlPlane, node_helm: Helm
) -> None:
    cluster = node_cluster
    before = {p["metadata"]["name"] for p in pods(cluster, install.ns, ROUTERS)}
    events = len(history(cluster, install.ns, "chat-a"))
    with Load(install.router_ip, 80, "chat-a", workers=3, pause=0.0) as load:
        wait_for(cluster, install.ns, "traffic through the routers", lambda: load.total >= 100)
        node_helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            install.ns,
            "--wait",
            "--timeout",
            "5m",
            *install.args,
            "--set-json",
            f'router.podAnnotations={{"e2e/rollout": "{uuid.uuid4().hex[:8]}"}}',
            timeout=600,
        )
        after = wait_ready(cluster, install.ns, ROUTERS, 2)
        assert not before & {p["metadata"]["name"] for p in after}, "every router Pod was replaced"
        served = load.total
        wait_for(cluster, install.ns, "traffic through the new routers", lambda: load.total >= served + 100)
    print(f"\nrequests during the router rollout: {dict(load.outcomes)}")
    assert set(load.outcomes) == {"200 v2"}, dict(load.outcomes)
    # The upgrade left the releases and their history alone.
    assert status(cluster, install.tenant, "chat-a")["phase"] == "Promoted"
    assert len(history(cluster, install.ns, "chat-a")) == events


def test_uninstall_keeps_crds_releases_and_lineage(
    install: Install, node_cluster: ControlPlane, node_helm: Helm
) -> None:
    cluster = node_cluster
    rows = history(cluster, install.ns, "chat-a")
    node_helm("uninstall", RELEASE, "-n", install.ns, "--wait", timeout=300)
    wait_for(
        cluster,
        install.ns,
        "the chart's Pods gone",
        lambda: not pods(cluster, install.ns, "app.kubernetes.io/name=tinct"),
    )
    for crd in ("modelversions.tinct.io", "grayreleases.tinct.io", "clusterkopfpeerings.kopf.dev"):
        cluster.kubectl("get", "crd", crd)
    assert status(cluster, install.tenant, "chat-a")["phase"] == "Promoted"
    assert status(cluster, install.tenant, "chat-b")["phase"] == "RolledBack"
    assert get_json(cluster, "pvc", f"{FULL}-lineage", "-n", install.ns)["status"]["phase"] == "Bound"
    assert history(cluster, install.ns, "chat-a") == rows
