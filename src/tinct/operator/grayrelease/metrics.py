"""Prometheus metrics of the GrayRelease controller, served by ``tinct operator --metrics-port``."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tinct.api.v1alpha1.grayrelease import GrayReleasePhase, GrayReleaseStatus

__all__ = ["PHASES", "ReleaseMetrics", "serve"]

PHASES: tuple[GrayReleasePhase, ...] = (
    "Pending",
    "Progressing",
    "Paused",
    "Promoted",
    "RolledBack",
    "Failed",
)
_VERDICTS = {"Pass": 1.0, "Fail": 0.0, "Inconclusive": -1.0, "Error": -1.0}


class ReleaseMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r, key = self.registry, ["namespace", "release"]
        self.phase = Gauge(
            "tinct_release_phase", "1 for the phase the release is in.", [*key, "phase"], registry=r
        )
        self.step = Gauge(
            "tinct_release_step",
            "Current step as an index: 0 is step 1/n, as kubectl shows it.",
            key,
            registry=r,
        )
        self.cell_weight = Gauge(
            "tinct_release_cell_weight",
            "Percent of each dye cell's traffic the candidate gets, in force.",
            [*key, "cell"],
            registry=r,
        )
        self.held = Gauge(
            "tinct_release_held_seconds",
            "Seconds the release has been held without progress (preconditions, capacity, routers, "
            "inconclusive analyses); 0 while it progresses. At progressDeadlineSeconds it is paused.",
            key,
            registry=r,
        )
        self.table_version = Gauge(
            "tinct_release_table_version", "Version of the routing table written.", key, registry=r
        )
        self.failed = Gauge("tinct_release_failed_analyses", "Failed analyses so far.", key, registry=r)
        self.inconclusive = Gauge(
            "tinct_release_inconclusive_analyses", "Consecutive inconclusive analyses.", key, registry=r
        )
        self.value = Gauge(
            "tinct_release_analysis_value",
            "Last value of each analysis metric.",
            [*key, "metric"],
            registry=r,
        )
        self.verdict = Gauge(
            "tinct_release_analysis_verdict",
            "Last verdict of each metric: 1 pass, 0 fail, -1 inconclusive.",
            [*key, "metric"],
            registry=r,
        )
        self.analyses = Counter(
            "tinct_release_analyses", "Analyses run, by verdict.", [*key, "verdict"], registry=r
        )
        self.transitions = Counter(
            "tinct_release_transitions", "Transitions, by reason.", [*key, "reason"], registry=r
        )
        self.notifications = Counter(
            "tinct_release_notifications",
            "Notifications by webhook and outcome: sent, refused (a 4xx answer), failed (after its "
            "retries), dropped (its queue was full, or its circuit breaker was open).",
            ["notifier", "result"],
            registry=r,
        )
        self.notifier_open = Gauge(
            "tinct_release_notifier_open",
            "1 while a webhook's circuit breaker is open: after failed attempts in a row, its "
            "notifications are dropped at once until one is tried again.",
            ["notifier"],
            registry=r,
        )
        self.notifier_opened = Counter(
            "tinct_release_notifier_opened",
            "Times a webhook's circuit breaker opened.",
            ["notifier"],
            registry=r,
        )
        self.notification_retries = Counter(
            "tinct_release_notification_retries",
            "Notification attempts repeated after a failed one, by webhook.",
            ["notifier"],
            registry=r,
        )

    def observe(self, namespace: str, release: str, status: GrayReleaseStatus) -> None:
        for p in PHASES:
            self.phase.labels(namespace, release, p).set(1.0 if status.phase == p else 0.0)
        self.step.labels(namespace, release).set(status.step)
        for cell, weight in status.weights.items():
            self.cell_weight.labels(namespace, release, cell).set(weight)
        held = (datetime.now(UTC) - status.blocked_since).total_seconds() if status.blocked_since else 0.0
        self.held.labels(namespace, release).set(max(0.0, held))
        if status.routing is not None:
            self.table_version.labels(namespace, release).set(status.routing.version)
        self.failed.labels(namespace, release).set(status.failed_analyses)
        self.inconclusive.labels(namespace, release).set(status.inconclusive_analyses)
        if status.last_analysis is not None:
            for m in status.last_analysis.metrics:
                self.value.labels(namespace, release, m.name).set(math.nan if m.value is None else m.value)
                self.verdict.labels(namespace, release, m.name).set(_VERDICTS[m.verdict])

    def forget(self, namespace: str, release: str) -> None:
        """Drop the series of a deleted release."""
        for metric in (
            self.phase,
            self.step,
            self.cell_weight,
            self.held,
            self.table_version,
            self.failed,
            self.inconclusive,
            self.value,
            self.verdict,
            self.analyses,
            self.transitions,
        ):
            for labels in list(metric._metrics):  # prometheus_client lists children nowhere else
                if labels[:2] == (namespace, release):
                    metric.remove(*labels)


def serve(metrics: ReleaseMetrics, port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on ``port`` in a background thread."""
    start_http_server(port, addr=addr, registry=metrics.registry)
