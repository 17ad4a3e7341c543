"""Prometheus metrics of the router, on a registry of its own.

Every per-release series carries the release's ``namespace`` (the table's, or ``""``) as its
first label, so releases of one name in two namespaces behind one router stay apart.
Label values come only from the table (namespace, release, scheduler versions, dye tags
built from configured bucket/role/latency names), from a fixed list (side, fallback reason) or from the
HTTP status code, so the number of series stays bounded whatever clients send.

The per-request series (request count, time-to-first-byte and duration histograms, and for
classified answers the token series of :mod:`tinct.router.tokens`: time to first token,
inter-token latency, output tokens, contract violations) are plain counters kept by the
event loop (:class:`~tinct.histogram.Histogram`) and turned into metric families only when
scraped: ``prometheus_client``'s ``labels()``/``observe()`` take a lock and walk the buckets
in Python, which cost a measurable share of a proxied request. Rare events (fallbacks,
ejections, table changes) use ordinary ``prometheus_client`` metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from tinct.histogram import Histogram
from tinct.router.tokens import Meter, MeterSweep

if TYPE_CHECKING:
    from tinct.router.exchange import Exchange
    from tinct.router.table import CompiledTable

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Gaps between tokens: finer below 100 ms, where engines' inter-token latencies are.
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Output tokens of one answer.
TOKEN_BUCKETS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0)
_REQUEST_LABELS = ("namespace", "release", "side", "scheduler_version", "dye_tag", "code")
_RESPONSE_LABELS = ("namespace", "release", "side", "dye_tag", "status_class")
_LATENCY_LABELS = ("namespace", "release", "side", "dye_tag")
_VIOLATION_LABELS = ("namespace", "release", "side", "dye_tag", "kind")
#: The status classes of ``tinct_router_responses_total``: 429 (throttled) apart from 4xx.
STATUS_CLASSES = ("2xx", "3xx", "4xx", "429", "5xx")
SeriesKey = tuple[str, str, str, str]


def _series(series: dict[SeriesKey, Histogram], key: SeriesKey, bounds: tuple[float, ...]) -> Histogram:
    """The histogram of ``key`` in ``series``, made with ``bounds`` the first time."""
    h = series.get(key)
    if h is None:
        h = series[key] = Histogram(bounds)
    return h


def status_class(code: int) -> str:
    """``429``, else ``<first digit>xx`` (``1xx`` and garbage codes as ``5xx``: not an answer)."""
    if code == 429:
        return "429"
    if 200 <= code < 500:
        return f"{code // 100}xx"
    return "5xx"


class _RequestCollector(Collector):
    def __init__(self, metrics: RouterMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        req = CounterMetricFamily(
            "tinct_router_requests",
            "Requests answered, by the side that served them.",
            labels=_REQUEST_LABELS,
        )
        classes: dict[tuple[str, str, str, str, str], int] = {}
        for (namespace, release, side, version, tag, code), n in self.m.counts.items():
            req.add_metric([namespace, release, side, version, tag, str(code)], n)
            ckey = (namespace, release, side, tag, status_class(code))
            classes[ckey] = classes.get(ckey, 0) + n
        yield req
        resp = CounterMetricFamily(
            "tinct_router_responses",
            "Answers by status class (2xx, 3xx, 4xx, 429, 5xx: throttling apart from other "
            "client errors), by the side that served them; the same answers as "
            "tinct_router_requests_total.",
            labels=_RESPONSE_LABELS,
        )
        for key, n in classes.items():
            resp.add_metric(list(key), n)
        yield resp
        bad = CounterMetricFamily(
            "tinct_router_contract_violations",
            "Answers that broke the OpenAI API contract, by kind (sse_framing, sse_no_done, "
            "no_choices, error_body, not_sse; at most one of each kind per answer), by the "
            "side that answered. The client received the answer unchanged.",
            labels=_VIOLATION_LABELS,
        )
        for vkey, n in self.m.violations.items():
            bad.add_metric(list(vkey), n)
        yield bad
        for name, doc, series in (
            (
                "tinct_router_time_to_first_byte_seconds",
                "From request received to response headers sent to the client; for a "
                "fallback, the candidate's until it failed and stable's from its own attempt.",
                self.m.ttfb_series,
            ),
            (
                "tinct_router_request_duration_seconds",
                "From request received to the last byte sent to the client.",
                self.m.duration_series,
            ),
            (
                "tinct_router_time_to_first_token_seconds",
                "From request received to the first SSE event carrying content sent to the client "
                "(streams), or to the whole answer (2xx answers not streamed). Classified requests.",
                self.m.ttft_series,
            ),
            (
                "tinct_router_inter_token_latency_seconds",
                "Gaps between consecutive SSE events carrying content, as relayed to the client.",
                self.m.itl_series,
            ),
            (
                "tinct_router_output_tokens",
                "Output tokens per whole answer: its usage.completion_tokens when it says, else "
                "(streams) the SSE events carrying content.",
                self.m.tokens_series,
            ),
        ):
            fam = HistogramMetricFamily(name, doc, labels=_LATENCY_LABELS)
            for labels, h in series.items():
                fam.add_metric(list(labels), h.buckets(), h.total)
            yield fam


class ShadowMetrics:
    """Mirrored requests (:mod:`tinct.router.shadow`) and their pairs: families of their own,
    so a mirror never shows in the live series above."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.mirrors = Counter(
            "tinct_router_shadow_mirrors",
            "Requests stable answered that were mirrored, by where the mirror went: the "
            "candidate, or stable again (the noise floor).",
            ["namespace", "release", "dye_tag", "target"],
            registry=registry,
        )
        self.skipped = Counter(
            "tinct_router_shadow_skipped",
            "Mirrors without a whole pair compared, by reason: not mirrored (budget), pair not "
            "sent (stable_error: stable gave no whole answer; send_dropped: the send queue was "
            "full or the comparer down), or sent to be counted by the comparer (too_long: an "
            "answer over maxBytes, sent truncated; timeout, unreachable, reset, bad_answer: "
            "the mirror failed).",
            ["namespace", "release", "reason"],
            registry=registry,
        )
        self.pairs_sent = Counter(
            "tinct_router_shadow_pairs_sent",
            "Pairs the comparer took.",
            ["namespace", "release"],
            registry=registry,
        )
        self.held_bytes = Gauge(
            "tinct_router_shadow_held_bytes",
            "Bytes held for pairs: reserved by mirrors in flight and queued for the comparer.",
            registry=registry,
        )


class RouterMetrics:
    """The router's metric families, with per-label-set children cached."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        #: (namespace, release, side, scheduler_version, dye_tag, code) -> requests answered
        self.counts: dict[tuple[str, str, str, str, str, int], int] = {}
        #: (namespace, release, side, dye_tag) -> histogram
        self.ttfb_series: dict[SeriesKey, Histogram] = {}
        self.duration_series: dict[SeriesKey, Histogram] = {}
        self.ttft_series: dict[SeriesKey, Histogram] = {}
        self.itl_series: dict[SeriesKey, Histogram] = {}
        self.tokens_series: dict[SeriesKey, Histogram] = {}
        #: (namespace, release, side, dye_tag, kind) -> answers with that violation
        self.violations: dict[tuple[str, str, str, str, str], int] = {}
        #: Reads the chunks of streams' meters, apart from their relay.
        self.sweep = MeterSweep()
        r.register(_RequestCollector(self))
        self.fallbacks = Counter(
            "tinct_router_fallbacks",
            "Candidate requests served by stable instead, by reason.",
            ["namespace", "release", "reason", "dye_tag"],
            registry=r,
        )
        self.ejections = Counter(
            "tinct_router_candidate_ejections",
            "Times the candidate was taken out of rotation after consecutive failures (once per "
            "ejection, however many requests in flight fail after it).",
            ["namespace", "release"],
            registry=r,
        )
        self.candidate_failures = Counter(
            "tinct_router_candidate_failures",
            "Failed candidate attempts, each counting towards fallback.consecutiveFailures: "
            "before any of the answer reached the client, so the request fell back "
            "(version_mismatch, latency_too_high, upstream_error, unreachable, adapter_missing), or cut "
            "mid-answer (truncated: the backend failed; idle_timeout: it went silent).",
            ["namespace", "release", "reason"],
            registry=r,
        )
        self.version_mismatches = Counter(
            "tinct_router_version_mismatches",
            "426 answers from a backend (it refused the X-Scheduler-Version it was sent): the "
            "candidate's fall back to stable, stable's reach the client.",
            ["namespace", "release", "side"],
            registry=r,
        )
        self.ejected = Gauge(
            "tinct_router_candidate_ejected",
            "1 while the candidate is ejected.",
            ["namespace", "release"],
            registry=r,
        )
        self.truncated = Counter(
            "tinct_router_truncated_responses",
            "Answers cut mid-body because the backend failed (upstream_error) or went silent "
            "for fallback.idleTimeoutMs (idle_timeout); the client saw a truncated answer. "
            "Counted against the side that cut it, per dye tag.",
            ["namespace", "release", "side", "reason", "dye_tag"],
            registry=r,
        )
        self.upstream_rejected = Counter(
            "tinct_router_upstream_rejected",
            "Backend answers refused before any of them reached the client: head over the "
            "limits (head_too_large), unparsable (malformed), or not in time (head_timeout).",
            ["namespace", "release", "side", "reason"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "tinct_router_upstream_retries",
            "Requests sent again, once, on a new connection because the reused keep-alive "
            "connection they went out on had been closed by the backend before any byte of "
            "the answer (its idle timeout); the client saw one answer.",
            ["namespace", "release", "side"],
            registry=r,
        )
        self.table_version = Gauge(
            "tinct_router_table_version",
            "Version of the routing table in force.",
            ["namespace", "release"],
            registry=r,
        )
        self.table_rejections = Counter(
            "tinct_router_table_rejections",
            "Routing tables rejected because they failed validation.",
            registry=r,
        )
        self.shadow = ShadowMetrics(r)

    def request(self, ex: Exchange) -> None:
        """Record one answered request (its outcome as ``ex`` says), ending now."""
        total = time.perf_counter() - ex.started
        table = ex.table
        key = (table.namespace, table.release, ex.side, ex.scheduler_version, ex.tag, ex.status)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        hkey = (table.namespace, table.release, ex.side, ex.tag)
        d = self.duration_series.get(hkey)
        if d is None:
            # Every request's series has a time to first byte, observed or not.
            d = self.duration_series[hkey] = Histogram(LATENCY_BUCKETS)
            self.ttfb_series.setdefault(hkey, Histogram(LATENCY_BUCKETS))
        d.observe(total)
        if ex.ttfb is not None:
            self.ttfb_series[hkey].observe(ex.ttfb)
        meter = ex.meter
        if meter is not None:
            self._tokens(hkey, meter)

    def meter(self, ex: Exchange, status: int, stream: bool, asked_stream: bool) -> Meter:
        """A :class:`~tinct.router.tokens.Meter` for the answer ``ex`` is about to relay."""
        table = ex.table
        hkey = (table.namespace, table.release, ex.side, ex.tag)
        itl = _series(self.itl_series, hkey, ITL_BUCKETS)
        return Meter(ex.started, status, stream, asked_stream, itl, self.sweep if stream else None)

    def _tokens(self, hkey: SeriesKey, meter: Meter) -> None:
        ttft = meter.ttft
        if ttft is not None:
            _series(self.ttft_series, hkey, LATENCY_BUCKETS).observe(ttft)
        tokens = meter.output_tokens
        if tokens is not None:
            _series(self.tokens_series, hkey, TOKEN_BUCKETS).observe(float(tokens))
        for kind in meter.violations:
            vkey = (*hkey, kind)
            self.violations[vkey] = self.violations.get(vkey, 0) + 1

    def candidate_failed(self, ex: Exchange, seconds: float) -> None:
        """A candidate attempt failed ``seconds`` after the request came in, and the request
        falls back: that is what the fallback cost, observed as the candidate's time to first
        byte (in the request's cell)."""
        table = ex.table
        hkey = (table.namespace, table.release, "candidate", ex.tag)
        _series(self.ttfb_series, hkey, LATENCY_BUCKETS).observe(seconds)

    def fallback(self, table: CompiledTable, reason: str, tag: str) -> None:
        self.fallbacks.labels(table.namespace, table.release, reason, tag).inc()

    def ejection(self, table: CompiledTable) -> None:
        self.ejections.labels(table.namespace, table.release).inc()

    def candidate_failure(self, table: CompiledTable, reason: str) -> None:
        self.candidate_failures.labels(table.namespace, table.release, reason).inc()

    def version_mismatch(self, table: CompiledTable, side: str) -> None:
        self.version_mismatches.labels(table.namespace, table.release, side).inc()

    def upstream_retry(self, table: CompiledTable, side: str) -> None:
        self.upstream_retries.labels(table.namespace, table.release, side).inc()


__all__ = [
    "ITL_BUCKETS",
    "LATENCY_BUCKETS",
    "STATUS_CLASSES",
    "TOKEN_BUCKETS",
    "RouterMetrics",
    "ShadowMetrics",
    "status_class",
]
