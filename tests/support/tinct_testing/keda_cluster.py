"""Cluster-side helpers of the autoscaling tests: reading and awaiting a Deployment's replicas."""

from __future__ import annotations

import json
import time

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.modelversion_cluster import get_object as get
from tinct_testing.wait import eventually

#: Seconds a scaling test waits for the HPA controller to act (it evaluates every second).
WAIT = 120.0


def replicas(cluster: Cluster, ns: str, name: str) -> int | None:
    """The replicas Deployment ``ns/name`` asks for (``spec.replicas``), None if it is absent."""
    dep = get(cluster, ns, "deployment", name)
    return None if dep is None else int(dep["spec"].get("replicas", 1))


def wait_replicas(cluster: Cluster, ns: str, name: str, n: int, what: str) -> float:
    """Seconds until Deployment ``name`` asks for ``n`` replicas; on timeout the HPAs' status says why."""
    t0 = time.monotonic()
    try:
        eventually(lambda: replicas(cluster, ns, name) == n, timeout=WAIT, what=what)
    except AssertionError as exc:
        hpas = json.loads(cluster.kubectl("get", "hpa", "-n", ns, "-o", "json").stdout).get("items", [])
        status = {h["metadata"]["name"]: h.get("status") for h in hpas}
        raise AssertionError(
            f"{exc}; replicas now {replicas(cluster, ns, name)}; HPA status {status}"
        ) from None
    return time.monotonic() - t0
