"""The GrayRelease operator scaling each side through KEDA, on the real API server,
kube-controller-manager, Prometheus and KEDA (``spec.autoscaling.keda``).

The engines' queue gauges come from :class:`~queue_exporter.QueueExporter`; a real
Prometheus scrapes them, KEDA's prometheus scaler queries it, and the HPA controller sets
each Deployment's ``spec.replicas``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.keda_cluster import WAIT, replicas, wait_replicas
from tinct_testing.queue_exporter import QueueExporter
from tinct_testing.release_cluster import (
    HOLD,
    apply,
    backends,
    condition,
    example,
    get,
    operator,
    release_status,
    wait_release,
)
from tinct_testing.wait import eventually

pytestmark = pytest.mark.usefixtures("crds", "keda")

#: One cell at 50 % then 100 %: the candidate may take up to half of maxReplicas at step 0.
CELLS = [{"match": {}, "weights": [50, 100]}]


@pytest.fixture(autouse=True)
def _needs_controllers(cluster: Cluster) -> None:
    if not getattr(cluster, "controllers", False):
        pytest.fail("no kube-controller-manager runs (KUBEBUILDER_ASSETS?); unset it to use the built one")


def _release(keda: dict[str, Any] | None) -> dict[str, Any]:
    doc = example(analysis=HOLD, cells=CELLS)
    spec = doc["spec"]
    spec["stable"]["engine"], spec["candidate"]["engine"] = "sglang", "vllm"
    spec["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 12,
        **({"keda": keda} if keda is not None else {}),
    }
    return doc


def _bounds(cluster: Cluster, ns: str, name: str) -> tuple[int, int] | None:
    so = get(cluster, ns, "scaledobject", name)
    return None if so is None else (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"])


def test_each_side_scales_on_its_own_queue_through_keda(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus]
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path)
    figures: dict[str, Any] = {}
    with QueueExporter() as queues:
        queues.set("sglang", ns, "sched-v1", 0)
        queues.set("vllm", ns, "sched-v2", 0)
        prom = prometheus()
        prom.set_targets([queues.target], wait=True)
        with operator(ns, tmp_path / "lineage", TINCT_PROMETHEUS_URL=prom.url):
            # First the HPA way; then the same release switches to KEDA.
            apply(cluster, ns, _release(None))
            wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", "Progressing")
            eventually(
                lambda: get(cluster, ns, "hpa", "tinct-chat-candidate"), timeout=WAIT, what="tinct's HPAs"
            )
            apply(cluster, ns, _release({"targetPerReplica": 5, "scaleDownStabilizationSeconds": 0}))
            eventually(
                lambda: _bounds(cluster, ns, "tinct-chat-candidate"),
                timeout=WAIT,
                what="the candidate's ScaledObject",
            )
            eventually(
                lambda: (
                    get(cluster, ns, "hpa", "tinct-chat-candidate") is None
                    and get(cluster, ns, "hpa", "tinct-chat-stable") is None
                    and get(cluster, ns, "hpa", "keda-hpa-tinct-chat-candidate") is not None
                    and get(cluster, ns, "hpa", "keda-hpa-tinct-chat-stable") is not None
                ),
                timeout=WAIT,
                what="tinct's HPAs replaced by KEDA's",
            )
            assert _bounds(cluster, ns, "tinct-chat-candidate") == (1, 6), "half of maxReplicas at 50 %"
            assert _bounds(cluster, ns, "tinct-chat-stable") == (1, 12), "stable keeps its floor, up to max"
            so = get(cluster, ns, "scaledobject", "tinct-chat-candidate")
            assert so is not None
            assert so["metadata"]["ownerReferences"][0]["kind"] == "GrayRelease"
            assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == prom.url

            # The candidate's queue grows: only the candidate scales.
            queues.set("vllm", ns, "sched-v2", 17)
            figures["candidate_up_s"] = round(wait_replicas(cluster, ns, "sched-v2", 4, "candidate at 4"), 1)
            assert replicas(cluster, ns, "sched-v1") == 1, "stable does not scale on the candidate's queue"
            # Stable's grows: only stable scales.
            queues.set("sglang", ns, "sched-v1", 12)
            figures["stable_up_s"] = round(wait_replicas(cluster, ns, "sched-v1", 3, "stable at 3"), 1)
            assert replicas(cluster, ns, "sched-v2") == 4
            # Past the candidate's maximum: its bound, not the queue, decides.
            queues.set("vllm", ns, "sched-v2", 300)
            wait_replicas(cluster, ns, "sched-v2", 6, "candidate at its maximum of 6")
            queues.set("vllm", ns, "sched-v2", 0)
            figures["candidate_down_s"] = round(
                wait_replicas(cluster, ns, "sched-v2", 1, "candidate at 1"), 1
            )
            assert replicas(cluster, ns, "sched-v1") == 3

            st = release_status(cluster, ns)
            cond = condition(st, "AutoscalingReady")
            assert (cond["status"], cond["reason"]) == ("True", "Applied"), cond
            assert [(s["side"], s["scaledObject"], s["hpa"], s["managed"]) for s in st["autoscaling"]] == [
                ("stable", "tinct-chat-stable", "keda-hpa-tinct-chat-stable", True),
                ("candidate", "tinct-chat-candidate", "keda-hpa-tinct-chat-candidate", True),
            ]
            assert st["autoscaling"][1]["query"] == (
                f'sum(vllm:num_requests_waiting{{namespace="{ns}",service="sched-v2"}})'
            )

            cluster.kubectl("delete", "grayrelease", "chat", "-n", ns, "--wait=false")
            eventually(
                lambda: get(cluster, ns, "grayrelease", "chat") is None, timeout=WAIT, what="the release gone"
            )
    # The garbage collector takes the ScaledObjects (it learns KEDA's kinds within its
    # discovery period), and KEDA its HPAs; the Deployments stay as they are.
    eventually(
        lambda: all(
            get(cluster, ns, kind, name) is None
            for kind, name in (
                ("scaledobject", "tinct-chat-stable"),
                ("scaledobject", "tinct-chat-candidate"),
                ("hpa", "keda-hpa-tinct-chat-stable"),
                ("hpa", "keda-hpa-tinct-chat-candidate"),
            )
        ),
        timeout=WAIT,
        what="the ScaledObjects and KEDA's HPAs collected",
    )
    assert replicas(cluster, ns, "sched-v1") == 3
    print(json.dumps(figures))


def test_foreign_scaledobject_is_reported_and_left_alone(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    prometheus: Callable[..., Prometheus],
) -> None:
    ns = namespace
    backends(cluster, ns, tmp_path)
    prom = prometheus()
    team = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "team-so"},
        "spec": {
            "scaleTargetRef": {"name": "sched-v2"},
            "minReplicaCount": 2,
            "maxReplicaCount": 5,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {"serverAddress": prom.url, "query": "vector(1)", "threshold": "1"},
                }
            ],
        },
    }
    apply(cluster, ns, team)
    with operator(ns, tmp_path / "lineage", TINCT_PROMETHEUS_URL=prom.url):
        apply(cluster, ns, _release({}))
        st = wait_release(
            cluster,
            ns,
            lambda s: any(c["type"] == "AutoscalingReady" for c in s.get("conditions", [])),
            "autoscaling condition",
        )
        stable = eventually(
            lambda: _bounds(cluster, ns, "tinct-chat-stable"), timeout=WAIT, what="stable's ScaledObject"
        )
        st = release_status(cluster, ns)
    cond = condition(st, "AutoscalingReady")
    assert (cond["status"], cond["reason"]) == ("False", "ForeignScaledObject"), cond
    assert "ScaledObject team-so" in cond["message"]
    assert stable == (1, 12)
    assert get(cluster, ns, "scaledobject", "tinct-chat-candidate") is None
    left = get(cluster, ns, "scaledobject", "team-so")
    assert left is not None
    assert (left["spec"]["minReplicaCount"], left["spec"]["maxReplicaCount"]) == (2, 5)
    assert not left["metadata"].get("ownerReferences")
    assert [s["managed"] for s in st["autoscaling"]] == [True, False]
