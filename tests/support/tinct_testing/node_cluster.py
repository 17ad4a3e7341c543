"""Helpers of the end-to-end tests on the real node: Pods, backends from the tinct image,
traffic through Services, Prometheus following Pods, and what to print when a wait fails."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.images import Image
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.release_cluster import service, workload
from tinct_testing.release_traffic import complete
from tinct_testing.repeat import Repeating
from tinct_testing.wait import eventually

#: Upper bound of every wait on the node (images start, probes pass, kube-proxy catches
#: up); a deadline for a loaded machine, never a measured figure.
WAIT = 240.0
BACKEND_PORT = 8000

RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def node_namespace(cluster: Cluster, prefix: str) -> str:
    """A fresh namespace on the node's cluster (the caller deletes it)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    return name


def get_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def pods(cluster: Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "pods", "-n", ns, "-l", selector)["items"]
    return items


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def explain(cluster: Cluster, ns: str) -> str:
    """What a failed wait prints: the namespace's Pods and its latest Events."""
    listing = cluster.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
    events = cluster.kubectl(
        "get",
        "events",
        "-n",
        ns,
        "--sort-by=.lastTimestamp",
        "-o",
        "custom-columns=OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message",
        check=False,
    ).stdout.splitlines()
    return f"pods in {ns}:\n{listing}\nlatest events:\n" + "\n".join(events[-25:])


def wait_for(cluster: Cluster, ns: str, what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    """:func:`~tinct_testing.wait.eventually` for ``check``; a failure shows the namespace's state."""
    return eventually(check, timeout=timeout, interval=0.5, what=what, explain=lambda: explain(cluster, ns))


def wait_ready(
    cluster: Cluster, ns: str, selector: str, n: int, timeout: float = WAIT
) -> list[dict[str, Any]]:
    """Exactly ``n`` Pods of ``selector`` Ready (none terminating besides): their manifests."""

    def check() -> list[dict[str, Any]] | None:
        found = pods(cluster, ns, selector)
        ready = [p for p in found if is_ready(p)]
        return ready if len(ready) == n == len(found) else None

    got: list[dict[str, Any]] = wait_for(cluster, ns, f"{n} Ready Pods of {selector}", check, timeout)
    return got


def backend(
    name: str, image: Image, version: str, *, fail: bool = False, replicas: int = 1
) -> list[dict[str, Any]]:
    """A Deployment of the engine emulator from the tinct image (``tinct emulator``, serving
    ``version`` as its model; ``fail``: every answer a 503), and its Service on
    :data:`BACKEND_PORT`."""
    container = {
        "name": "backend",
        "image": image.ref,
        "imagePullPolicy": "Never",
        "args": [
            "emulator",
            f"--port={BACKEND_PORT}",
            f"--model={version}",
            # Short answers: the tests count requests, not tokens.
            "--ttft-ms=5",
            "--itl-ms=1",
            "--output-tokens=4",
            f"--error-rate={1 if fail else 0}",
        ],
        "ports": [{"name": "http", "containerPort": BACKEND_PORT}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "20m", "memory": "48Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": RESTRICTED,
    }
    pod = {"containers": [container], "securityContext": POD_SECURITY, "terminationGracePeriodSeconds": 5}
    return [workload(name, replicas, pod), service(name, BACKEND_PORT, "http")]


def cluster_ip(cluster: Cluster, ns: str, service: str) -> str:
    ip: str = get_json(cluster, "service", service, "-n", ns)["spec"]["clusterIP"]
    return ip


def ask(host: str, port: int, model: str, session: str, timeout: float = 30.0) -> tuple[int, str]:
    """One chat completion for ``model`` on a new connection: (status, X-Scheduler-Active)."""
    got = complete(port, model, session, host=host, prompt="tell me about dye tags", timeout=timeout)
    return got.status, got.headers.get("X-Scheduler-Active", "-")


def wait_served(cluster: Cluster, ns: str, host: str, port: int, model: str, n: int = 20) -> None:
    """Wait until ``n`` requests in a row for ``model`` are answered 200 (every router has its table)."""

    def streak() -> bool:
        return all(ask(host, port, model, f"probe-{i}")[0] == 200 for i in range(n))

    wait_for(cluster, ns, f"{n} requests for {model} answered in a row", streak)


@dataclass
class Load(Repeating):
    """Steady requests for ``model`` to ``host:port`` from ``workers`` threads, each on a new connection.

    ``outcomes`` counts what came back: ``"200 v1"`` (status and side) or the exception's
    class name for a request that got no answer.
    """

    host: str
    port: int
    model: str
    workers: int = 2
    pause: float = 0.02
    join_timeout: float = 60.0

    def step(self, worker: int, i: int) -> None:
        try:
            status, side = ask(self.host, self.port, self.model, f"load-{worker}-{i}")
            self.tally(f"{status} {side}")
        except (OSError, http.client.HTTPException) as e:
            self.tally(type(e).__name__)

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


class PodTargets(Repeating):
    """Keep Prometheus scraping ``port`` of every running Pod of ``selector`` (like kubernetes_sd)."""

    pause = 1.0

    def __init__(self, cluster: Cluster, ns: str, selector: str, port: int, prom: Prometheus) -> None:
        self.cluster, self.ns, self.selector, self.port, self.prom = cluster, ns, selector, port, prom
        self.targets: list[str] = []

    def current(self) -> list[str]:
        ips = {
            p["status"].get("podIP")
            for p in pods(self.cluster, self.ns, self.selector)
            if p["status"].get("phase") == "Running"
        }
        return sorted(f"{ip}:{self.port}" for ip in ips if ip)

    def step(self, worker: int, i: int) -> None:
        try:
            now = self.current()
            if now != self.targets:
                self.prom.set_targets(now)
                self.targets = now
        except Exception:  # the next round tries again; a test waits on what it needs
            pass


def values(image: Image, **more: Any) -> list[str]:
    """``--set-json`` arguments: the chart's image is ``image``, then ``more`` (dotted keys)."""
    out = ["--set-json", f"image.repository={json.dumps(image.repository)}"]
    out += ["--set-json", f"image.tag={json.dumps(image.tag)}"]
    for key, value in more.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


__all__ = [
    "WAIT",
    "Load",
    "PodTargets",
    "ask",
    "backend",
    "cluster_ip",
    "explain",
    "get_json",
    "is_ready",
    "node_namespace",
    "pods",
    "values",
    "wait_for",
    "wait_ready",
    "wait_served",
]
