"""The comparer's Prometheus metrics, on a registry of its own (``GET /metrics``).

Label values come only from routing tables (namespace, release, dye tags), from fixed lists
(target, verdict, reason, judge outcome) or from the refusal reasons, never from what a
pair says before it is accepted, so the number of series stays bounded.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ComparerMetrics"]


class ComparerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.pairs = Counter(
            "tinct_shadow_pairs_total",
            "Mirrored pairs compared, by verdict (same, different, candidate_error, skipped); "
            "target stable: the noise floor (stable against itself)",
            ("namespace", "release", "dye_tag", "target", "verdict"),
            registry=r,
        )
        self.skipped = Counter(
            "tinct_shadow_skipped_total",
            "Pairs not compared, by reason (too_long, binary, stable_error, bad_request, ...)",
            ("namespace", "release", "reason"),
            registry=r,
        )
        self.judge = Counter(
            "tinct_shadow_judge_total",
            "Judge outcomes (match, mismatch, inconclusive, low_confidence, error, timeout, budget)",
            ("namespace", "release", "outcome"),
            registry=r,
        )
        self.refused = Counter(
            "tinct_shadow_refused_total",
            "Pairs refused at intake, by reason (invalid, unknown_release, uid, dye_tag, no_shadow)",
            ("reason",),
            registry=r,
        )
        self.dropped = Counter(
            "tinct_shadow_queue_dropped_total",
            "Accepted pairs dropped because the comparison queue was full",
            registry=r,
        )
        self.queue = Gauge("tinct_shadow_queue_depth", "Pairs waiting to be compared", registry=r)
        self.recorded = Counter(
            "tinct_shadow_recorded_total", "Pairs written to the shadow_pairs lineage table", registry=r
        )
        self.record_errors = Counter(
            "tinct_shadow_record_errors_total",
            "Batches of pairs the shadow_pairs table could not take (their rows are lost)",
            registry=r,
        )
        self.tables = Gauge(
            "tinct_shadow_tables", "Routing tables with a shadow share the comparer follows", registry=r
        )
