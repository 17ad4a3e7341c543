"""Engine queue-depth gauges on a real ``/metrics`` endpoint, for the autoscaling tests.

It exports the queue metrics tinct's KEDA scaling reads by default, under the engines' own
names (``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``, ``tgi_queue_size``), each
series labelled with the ``namespace`` and ``service`` of the side it stands for, the labels
the default query selects a side by. A test sets the depths; Prometheus scrapes them.
No engine runs here (no GPU, no weights): only the numbers an engine would export.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tinct.operator.grayrelease.engine import QUEUE_METRICS

__all__ = ["QueueExporter"]


class QueueExporter:
    """``exporter = QueueExporter().start()``; ``exporter.set("vllm", ns, "sched-v2", 20)``;
    ``exporter.target`` is its ``host:port`` for Prometheus; ``exporter.stop()``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._gauges = {
            engine: Gauge(
                names[0],
                f"{engine} queue depth (requests waiting)",
                ["namespace", "service"],
                registry=self.registry,
            )
            for engine, names in QUEUE_METRICS.items()
        }
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> QueueExporter:
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self._server.server_port}"

    def set(self, engine: str, namespace: str, service: str, depth: float) -> None:
        self._gauges[engine].labels(namespace=namespace, service=service).set(depth)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> QueueExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
