"""Helpers of the end-to-end tests on the real node: Pods, backends from the tinct image,
traffic through Services, Prometheus following Pods, and what to print when a wait fails."""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.images import Image
from tinct_testing.controlplane.prometheus import Prometheus

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
    """Poll ``check`` until it returns something truthy; fail with ``what`` and the namespace's state."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}\n{explain(cluster, ns)}")
        time.sleep(0.5)


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
    labels = {"app": name}
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
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [container],
                        "securityContext": POD_SECURITY,
                        "terminationGracePeriodSeconds": 5,
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": labels, "ports": [{"port": BACKEND_PORT, "targetPort": "http"}]},
        },
    ]


def cluster_ip(cluster: Cluster, ns: str, service: str) -> str:
    ip: str = get_json(cluster, "service", service, "-n", ns)["spec"]["clusterIP"]
    return ip


def ask(host: str, port: int, model: str, session: str, timeout: float = 30.0) -> tuple[int, str]:
    """One chat completion for ``model`` on a new connection: (status, X-Scheduler-Active)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "tell me about dye tags"}]})
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", "X-Session-Id": session},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("X-Scheduler-Active", "-")
    finally:
        conn.close()


def wait_served(cluster: Cluster, ns: str, host: str, port: int, model: str, n: int = 20) -> None:
    """Wait until ``n`` requests in a row for ``model`` are answered 200 (every router has its table)."""

    def streak() -> bool:
        return all(ask(host, port, model, f"probe-{i}")[0] == 200 for i in range(n))

    wait_for(cluster, ns, f"{n} requests for {model} answered in a row", streak)


@dataclass
class Load:
    """Steady requests for ``model`` to ``host:port`` from ``workers`` threads, each on a new connection.

    ``outcomes`` counts what came back: ``"200 v1"`` (status and side) or the exception's
    class name for a request that got no answer.
    """

    host: str
    port: int
    model: str
    workers: int = 2
    pause: float = 0.02
    outcomes: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self, worker: int) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                status, side = ask(self.host, self.port, self.model, f"load-{worker}-{i}")
                outcome = f"{status} {side}"
            except (OSError, http.client.HTTPException) as e:
                outcome = type(e).__name__
            with self._lock:
                self.outcomes[outcome] += 1
            i += 1
            self._stop.wait(self.pause)

    def __enter__(self) -> Load:
        self._threads = [
            threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.outcomes.values())


class PodTargets:
    """Keep Prometheus scraping ``port`` of every running Pod of ``selector`` (like kubernetes_sd)."""

    def __init__(self, cluster: Cluster, ns: str, selector: str, port: int, prom: Prometheus) -> None:
        self.cluster, self.ns, self.selector, self.port, self.prom = cluster, ns, selector, port, prom
        self.targets: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-targets", daemon=True)

    def current(self) -> list[str]:
        ips = {
            p["status"].get("podIP")
            for p in pods(self.cluster, self.ns, self.selector)
            if p["status"].get("phase") == "Running"
        }
        return sorted(f"{ip}:{self.port}" for ip in ips if ip)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                now = self.current()
                if now != self.targets:
                    self.prom.set_targets(now)
                    self.targets = now
            except Exception:  # the next round tries again; a test waits on what it needs
                pass
            self._stop.wait(1.0)

    def __enter__(self) -> PodTargets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


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
