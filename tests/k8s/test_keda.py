"""KEDA for real on the test control plane (``controlplane/keda.py``).

Its metrics API server is reached through the API server's aggregation layer, and
kube-controller-manager's HPA controller scales a Deployment on a ScaledObject's Prometheus
query: a real Prometheus scrapes engine queue gauges the test sets. Pods stay Pending (no
kubelet for them); ``spec.replicas`` is what the HPA controller changes and what is read.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tinct.operator.grayrelease.kube import ReleaseKube
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.keda import APISERVICE, InstalledKeda, Keda
from tinct_testing.controlplane.process import killed_hard, running
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.keda_cluster import WAIT, replicas, wait_replicas
from tinct_testing.queue_exporter import QueueExporter
from tinct_testing.release_cluster import apply, deployment, get
from tinct_testing.wait import eventually


@pytest.fixture(autouse=True)
def _needs_controllers(cluster: Cluster) -> None:
    if not getattr(cluster, "controllers", False):
        pytest.fail("no kube-controller-manager runs (KUBEBUILDER_ASSETS?); unset it to use the built one")


def _quantity(text: str) -> float:
    """A Kubernetes quantity as the metrics API writes a value: ``23`` or ``23500m``."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def scaled_object(name: str, deployment: str, prom: str, query: str, target: float) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": deployment},
            "minReplicaCount": 1,
            "maxReplicaCount": 10,
            # Without this the HPA waits 5 minutes before it scales down.
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {"serverAddress": prom, "query": query, "threshold": f"{target:g}"},
                }
            ],
        },
    }


def test_external_metrics_are_served_through_the_aggregation_layer(
    cluster: Cluster, keda: Keda | InstalledKeda
) -> None:
    service = keda.apiservice()["spec"]["service"]
    assert keda.available(), f"APIService {APISERVICE} is not Available"
    found = json.loads(cluster.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1").stdout)
    assert found["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert service["name"] == "keda-metrics-apiserver"
    kube = ReleaseKube()
    assert kube.served("keda.sh/v1alpha1", "scaledobjects")
    assert not kube.served("keda.sh/v1alpha1", "nothings")
    assert not kube.served("absent.tinct.io/v1", "scaledobjects")


def test_a_scaledobject_moves_replicas_up_and_down_with_the_queue(
    cluster: Cluster, namespace: str, keda: Keda | InstalledKeda, prometheus: Callable[..., Prometheus]
) -> None:
    ns, target = namespace, 5.0
    with QueueExporter() as exporter:
        exporter.set("vllm", ns, "sched-v2", 0)
        exporter.set("vllm", ns, "sched-v1", 0)
        prom = prometheus()
        prom.set_targets([exporter.target], wait=True)
        query = f'sum(vllm:num_requests_waiting{{namespace="{ns}",service="sched-v2"}})'
        apply(
            cluster,
            ns,
            deployment("sched-v2", ready=False),
            deployment("sched-v1", ready=False),
            scaled_object("queue", "sched-v2", prom.url, query, target),
        )
        eventually(
            lambda: get(cluster, ns, "hpa", "keda-hpa-queue"),
            timeout=WAIT,
            what="KEDA's HPA for the ScaledObject",
        )
        assert replicas(cluster, ns, "sched-v2") == 1

        depth = 23.0
        t0 = time.monotonic()
        exporter.set("vllm", ns, "sched-v2", depth)
        # The other Deployment's queue is not this ScaledObject's signal.
        exporter.set("vllm", ns, "sched-v1", 400)
        up = math.ceil(depth / target)
        wait_replicas(cluster, ns, "sched-v2", up, f"sched-v2 scaled up to {up} replicas")
        scaled_up = time.monotonic() - t0
        metric = keda.external_metric(ns, "s0-prometheus", "queue")
        assert [_quantity(m["value"]) for m in metric] == [depth]

        t0 = time.monotonic()
        exporter.set("vllm", ns, "sched-v2", 0)
        wait_replicas(cluster, ns, "sched-v2", 1, "sched-v2 scaled back down to 1 replica")
        scaled_down = time.monotonic() - t0
    assert replicas(cluster, ns, "sched-v1") == 1, "no ScaledObject targets sched-v1"
    print(
        json.dumps(
            {
                "queue_up_to_replicas_s": round(scaled_up, 1),
                "queue_down_to_replicas_s": round(scaled_down, 1),
                "replicas_up": up,
            }
        )
    )


@pytest.mark.usefixtures("own_control_plane")
def test_keda_dies_with_a_test_process_killed_hard(tmp_path: Path) -> None:
    """SIGKILL skips atexit and finally; neither KEDA process may outlive the test process."""
    setup = (
        "from tinct_testing.controlplane.harness import ControlPlane\n"
        "from tinct_testing.controlplane.keda import Keda\n"
        # Work directories in tmp_path: nothing runs the owner's cleanup.
        f"cp = ControlPlane(workdir=Path({str(tmp_path / 'cp')!r}), with_kwok=False).start()\n"
        f"k = Keda(cp, workdir=Path({str(tmp_path / 'keda')!r})).start()"
    )
    with killed_hard(setup, "[*k.pids, *cp.pids]", tmp_path, timeout=240) as pids:
        assert len(pids) == 5, pids  # KEDA's two, etcd, kube-apiserver, kube-controller-manager
        assert all(running(p) for p in pids)
    eventually(
        lambda: not any(running(p) for p in pids),
        timeout=30,
        what="no KEDA or control-plane process outliving its owner",
    )
