"""One release's world on the real API server: the example's backends in a namespace, both
emulated engines, a `tinct router --watch`, a Prometheus scraping it, and the operator on
demand, judged by that Prometheus.

Test modules subclass :class:`Stack` with the release they shape and build it in a fixture
with :meth:`Stack.running`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from kopf.testing import KopfRunner

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.engines import Engines
from tinct_testing.release_cluster import backends, in_phase, operator, release_status, wait_release
from tinct_testing.release_traffic import Router, router
from tinct_testing.wait import WAIT


@dataclass
class Stack:
    """What a release test runs against; ``root`` is where the operator writes the lineage."""

    cluster: Cluster
    ns: str
    root: Path
    engines: Engines
    router: Router
    prometheus: Prometheus

    @classmethod
    @contextmanager
    def running(
        cls,
        cluster: Cluster,
        ns: str,
        tmp: Path,
        prometheus: Callable[..., Prometheus],
        *,
        scrape_engines: bool = False,
        **behaviour: Any,
    ) -> Iterator[Self]:
        """The stack in ``ns`` for the block: :func:`~tinct_testing.release_cluster.backends`,
        :class:`~tinct_testing.engines.Engines` behaving as ``behaviour`` says, the router and a
        Prometheus (from the ``prometheus`` fixture) scraping it, and both engines with
        ``scrape_engines``."""
        backends(cluster, ns, tmp)
        with Engines(**behaviour) as engines, router(ns, tmp / "router.log") as r:
            prom = prometheus()
            targets = [r.port, engines.v1.port, engines.v2.port] if scrape_engines else [r.port]
            prom.set_targets([f"127.0.0.1:{port}" for port in targets])
            yield cls(cluster, ns, tmp / "lineage", engines, r, prom)

    def operator(self, **env: str) -> AbstractContextManager[KopfRunner]:
        """The operator on this namespace, its default Prometheus the one scraping this stack."""
        return operator(self.ns, self.root, TINCT_PROMETHEUS_URL=self.prometheus.url, **env)

    def status(self, name: str = "chat") -> dict[str, Any]:
        """Release ``name``'s status now (empty when it has none)."""
        return release_status(self.cluster, self.ns, name)

    def wait(
        self, until: Callable[[dict[str, Any]], Any], what: str, *, name: str = "chat", timeout: float = WAIT
    ) -> dict[str, Any]:
        """Release ``name``'s status once ``until(status)`` holds."""
        return wait_release(self.cluster, self.ns, until, what, name=name, timeout=timeout)

    def in_phase(self, phase: str, *, name: str = "chat", timeout: float = WAIT) -> dict[str, Any]:
        """Release ``name``'s status once its phase is ``phase``."""
        return in_phase(self.cluster, self.ns, phase, name=name, timeout=timeout)


__all__ = ["Stack"]
