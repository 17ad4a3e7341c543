"""Prometheus metrics of the router, on a registry of its own.

Label values come only from the table (release, scheduler versions, dye tags built from
configured bucket/role/latency names), from a fixed list (side, fallback reason) or from the
HTTP status code, so the number of series stays bounded whatever clients send. Label
children are cached: ``labels()`` is too slow to call on every request.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Tag label of requests that are not classified (other endpoints, rejected requests).
UNCLASSIFIED = "none"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RouterMetrics:
    """The router's metric families, with per-label-set children cached."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tinct_router_requests",
            "Requests answered, by the side that served them.",
            ["release", "side", "scheduler_version", "dye_tag", "code"],
            registry=r,
        )
        self.ttfb = Histogram(
            "tinct_router_time_to_first_byte_seconds",
            "From request received to response headers sent to the client.",
            ["release", "side", "dye_tag"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "tinct_router_request_duration_seconds",
            "From request received to the last byte sent to the client.",
            ["release", "side", "dye_tag"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "tinct_router_fallbacks",
            "Candidate requests served by stable instead, by reason.",
            ["release", "reason", "dye_tag"],
            registry=r,
        )
        self.ejections = Counter(
            "tinct_router_candidate_ejections",
            "Times the candidate was ejected after consecutive failures.",
            ["release"],
            registry=r,
        )
        self.ejected = Gauge(
            "tinct_router_candidate_ejected",
            "1 while the candidate is ejected.",
            ["release"],
            registry=r,
        )
        self.table_version = Gauge(
            "tinct_router_table_version",
            "Version of the routing table in force.",
            ["release"],
            registry=r,
        )
        self.table_rejections = Counter(
            "tinct_router_table_rejections",
            "Routing tables rejected because they failed validation.",
            registry=r,
        )
        self._req: dict[tuple[str, str, str, str, int], Counter] = {}
        self._hist: dict[tuple[str, str, str], tuple[Histogram, Histogram]] = {}

    def request(
        self,
        release: str,
        side: str,
        scheduler_version: str,
        tag: str,
        code: int,
        ttfb: float | None,
        total: float,
    ) -> None:
        """Record one answered request."""
        key = (release, side, scheduler_version, tag, code)
        c = self._req.get(key)
        if c is None:
            c = self._req[key] = self.requests.labels(release, side, scheduler_version, tag, str(code))
        c.inc()
        hkey = (release, side, tag)
        h = self._hist.get(hkey)
        if h is None:
            h = self._hist[hkey] = (self.ttfb.labels(*hkey), self.duration.labels(*hkey))
        if ttfb is not None:
            h[0].observe(ttfb)
        h[1].observe(total)

    def fallback(self, release: str, reason: str, tag: str) -> None:
        self.fallbacks.labels(release, reason, tag).inc()

    def ejection(self, release: str) -> None:
        self.ejections.labels(release).inc()


__all__ = ["UNCLASSIFIED", "RouterMetrics"]
