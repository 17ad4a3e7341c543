"""``spec.analysis`` of a GrayRelease: the metrics that judge the candidate, and how often.

Every metric name comes from :data:`MetricName`, built from the router built-ins
(:data:`ROUTER_METRICS`, of which :data:`QUANTILE_METRICS` are read from histograms) and the
engine built-ins (:data:`ENGINE_METRICS`); the name lists are derived from the same
literals, so the schema, its rules and the analysis cannot disagree on a name.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import Field

from tinct.api.v1alpha1.common import Model, defaulted
from tinct.api.v1alpha1.prometheus import PrometheusRef
from tinct.api.v1alpha1.rules import Rule, cel, cel_format

__all__ = [
    "DEFAULT_MIN_PAIRS",
    "ENGINE_METRICS",
    "ENGINE_METRICS_RULE",
    "MIN_INTERVAL_SECONDS",
    "QUANTILE_METRICS",
    "ROUTER_METRICS",
    "SHADOW_METRIC",
    "SHADOW_METRIC_RULE",
    "Analysis",
    "Duration",
    "EngineMetric",
    "Metric",
    "MetricName",
    "QuantileMetric",
    "RouterMetric",
    "parse_duration",
]

#: A duration as the schema takes it: whole numbers with a unit each (ms, s, m, h), e.g. 1m30s.
#: Held by a rule of :class:`Analysis` rather than a schema pattern, whose refusal quotes the regular
#: expression instead of saying how to write one.
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"
_DURATION_HELP = "a number and a unit (ms, s, m or h) such as 30s, 1m, 2h or 1m30s"
Duration = Annotated[str, Field(min_length=1, max_length=32)]

_DURATION = re.compile(r"([0-9]+)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
#: The shortest analysis interval the schema takes: a shorter window holds too few scrapes
#: of the routers to judge anything, and would have the operator query Prometheus non-stop.
MIN_INTERVAL_SECONDS = 2


def parse_duration(text: str) -> float:
    """Seconds in a duration like ``1m30s`` or ``500ms`` (the CRD's ``Duration`` pattern)."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 1m, 1m30s)")
    return sum(int(n) * _UNIT[u] for n, u in parts)


#: The built-ins judged on a quantile of a histogram, in milliseconds.
QuantileMetric = Literal["latency-p95", "ttft-p95", "itl-p95"]
#: The built-in metrics read from the routers' metrics, per dye cell.
RouterMetric = Literal["success-rate", QuantileMetric, "throttle-rate", "contract-violations"]
#: The built-in metrics read from the engines' own metrics (``engine`` on each side).
EngineMetric = Literal["queue-depth", "kv-cache-usage", "prefix-cache-hit-rate"]
#: The built-in read from the comparer's metrics of mirrored pairs.
ShadowMetric = Literal["shadow-agreement"]
#: What a metric of the analysis judges: a built-in, or ``custom`` PromQL.
MetricName = Literal[RouterMetric, EngineMetric, ShadowMetric, "custom"]

QUANTILE_METRICS: tuple[str, ...] = get_args(QuantileMetric)
ROUTER_METRICS: tuple[str, ...] = get_args(RouterMetric)
ENGINE_METRICS: tuple[str, ...] = get_args(EngineMetric)
SHADOW_METRIC: str = get_args(ShadowMetric)[0]
#: Pairs a cell needs in a window for a shadow-agreement verdict, when minPairs is not given.
DEFAULT_MIN_PAIRS = 20


def _cel_list(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


class Metric(Model):
    """A health check of the candidate, evaluated at every analysis interval."""

    model_config = cel(
        Rule(
            cel="self.name != 'custom' || has(self.query)",
            holds=lambda s: s.name != "custom" or s.query is not None,
            message="a custom metric needs a query",
        ),
        Rule(
            cel="self.name == 'custom' || !has(self.query)",
            holds=lambda s: s.name == "custom" or s.query is None,
            message="only custom metrics take a query",
        ),
        Rule(
            cel="has(self.min) || has(self.max) || has(self.maxMs)",
            holds=lambda s: s.min is not None or s.max is not None or s.max_ms is not None,
            message="give a threshold: min, max or maxMs",
        ),
        Rule(
            cel=f"!has(self.maxMs) || self.name in {_cel_list(QUANTILE_METRICS)}",
            holds=lambda s: s.max_ms is None or s.name in QUANTILE_METRICS,
            message="maxMs is for latency-p95, ttft-p95 and itl-p95; give others min or max",
        ),
        Rule(
            cel=f"!has(self.quantile) || self.name in {_cel_list(QUANTILE_METRICS)}",
            holds=lambda s: s.quantile is None or s.name in QUANTILE_METRICS,
            message="quantile is for latency-p95, ttft-p95 and itl-p95",
        ),
        Rule(
            cel=f"!has(self.minPairs) || self.name == '{SHADOW_METRIC}'",
            holds=lambda s: s.min_pairs is None or s.name == SHADOW_METRIC,
            message="minPairs is for shadow-agreement",
        ),
        Rule(
            cel=f"self.name != '{SHADOW_METRIC}' || (has(self.min) && !has(self.max) && !has(self.maxStableDelta))",
            holds=lambda s: (
                s.name != SHADOW_METRIC
                or (s.min is not None and s.max is None and s.max_stable_delta is None)
            ),
            message="shadow-agreement takes min (percent agreement after the noise floor) only",
        ),
    )

    name: MetricName
    """What is judged, for the candidate. From the routers' metrics of this release (per dye cell with
    perCell): success-rate (percent of the requests the candidate got answered whole and without a 5xx;
    fallbacks count against it, a 429 does not), latency-p95 (ms, time to first byte,
    tinct_router_time_to_first_byte_seconds), ttft-p95 (ms, time to first token: to the first SSE event
    carrying content, or to the whole answer when not streamed, tinct_router_time_to_first_token_seconds),
    itl-p95 (ms, inter-token latency, tinct_router_inter_token_latency_seconds), throttle-rate (percent of
    the candidate's requests answered 429, tinct_router_requests_total), contract-violations (OpenAI API
    contract violations per 100 answers of the candidate, tinct_router_contract_violations_total). From the
    engines' own metrics through Prometheus (spec.candidate.engine, and its metricsSelector): queue-depth
    (requests waiting in the engine's queue, mean over the window and the candidate's engines),
    kv-cache-usage (percent of the KV cache in use, mean over the window and engines),
    prefix-cache-hit-rate (percent of prompt tokens found in the prefix cache over the window). From the
    comparer's pairs of mirrored requests (cells[].shadow): shadow-agreement (percent of the pairs whose
    answers agree, minus the percent of stable's own second answers that disagreed, the noise floor; judged
    per cell and overall, each with minPairs pairs, tinct_shadow_pairs_total). custom: the PromQL in query."""
    min: float | None = None
    """Fail when the value is below (in the metric's unit: percent, ms, requests)."""
    max: float | None = None
    """Fail when the value is above (in the metric's unit: percent, ms, requests)."""
    max_ms: float | None = Field(default=None, gt=0)
    """latency-p95, ttft-p95, itl-p95: fail above this many milliseconds."""
    quantile: float | None = Field(default=None, gt=0, lt=1)
    """latency-p95, ttft-p95, itl-p95: the quantile judged instead of 0.95 (e.g. 0.99), interpolated within
    the histogram's buckets as histogram_quantile does."""
    query: str | None = Field(default=None, max_length=4096)
    """custom: a PromQL expression returning one number; $namespace, $release and $interval are replaced."""
    min_pairs: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description=f"shadow-agreement: compared pairs a cell (and the release) needs in a window "
        f"for a verdict (default {DEFAULT_MIN_PAIRS}); fewer is inconclusive.",
    )
    max_stable_delta: float | None = Field(default=None, ge=0)
    """Built-ins: also fail when the candidate is worse than stable over the same window by more than this, in
    the metric's unit: percentage points (success-rate, throttle-rate, contract-violations, kv-cache-usage,
    prefix-cache-hit-rate), milliseconds (latency-p95, ttft-p95, itl-p95), requests (queue-depth). Router
    metrics are compared cell by cell; engine metrics need stable's engine."""


class Analysis(Model):
    """How each step's window is judged. analysis: {} names no metrics: every step then moves
    on after interval without judging the candidate."""

    model_config = cel(
        Rule(
            cel=f"self.interval.matches(r'{DURATION_PATTERN}')",
            holds=lambda s: re.fullmatch(DURATION_PATTERN, s.interval) is not None,
            message=f"interval must be a duration: {_DURATION_HELP}",
            field_path=".interval",
            message_expression=cel_format(f"'%s' is not a duration: write {_DURATION_HELP}", "self.interval"),
            describe=lambda s: f"'{s.interval}' is not a duration: write {_DURATION_HELP}",
        ),
        # Only for a duration: what is not one has the rule above say how to write it.
        Rule(
            cel=f"!self.interval.matches(r'{DURATION_PATTERN}') "
            f"|| duration(self.interval) >= duration('{MIN_INTERVAL_SECONDS}s')",
            holds=lambda s: (
                re.fullmatch(DURATION_PATTERN, s.interval) is None
                or parse_duration(s.interval) >= MIN_INTERVAL_SECONDS
            ),
            message=f"interval must be at least {MIN_INTERVAL_SECONDS}s",
            field_path=".interval",
        ),
    )

    interval: Duration = Field(
        default="1m",
        description="Duration of each analysis window, e.g. 30s, 1m, 1m30s (default 1m, at least "
        f"{MIN_INTERVAL_SECONDS}s). A step's window starts when the routers serve its table; "
        "without metrics, each step lasts this long.",
    )
    failure_limit: int = Field(default=2, ge=0, le=100)
    """Failed analyses that roll the release back (default 2; 0 acts as 1)."""
    prometheus: PrometheusRef = defaulted(PrometheusRef)
    metrics: list[Metric] = Field(default_factory=list, max_length=16)
    """What the candidate is held to at each window (up to 16); each must pass for the release to step
    forward. Empty: no judgement, steps move on after interval."""
    min_requests: int = Field(default=10, ge=0, le=10_000_000)
    """Candidate requests needed in a window (per cell with perCell) for a verdict (default 10); fewer is
    inconclusive."""
    inconclusive_limit: int = Field(default=10, ge=1, le=10000)
    """Consecutive inconclusive analyses that pause the release (default 10)."""
    per_cell: bool = False
    """Judge the built-ins read from the routers (success-rate, latency-p95, ttft-p95, itl-p95, throttle-rate,
    contract-violations) per dye cell: every cell with minRequests must pass (default false)."""


#: A GrayReleaseSpec rule: shadow-agreement judges mirrored pairs, so some cell must mirror.
SHADOW_METRIC_RULE = Rule(
    cel="!has(self.analysis) || !has(self.analysis.metrics) || "
    f"!self.analysis.metrics.exists(m, m.name == '{SHADOW_METRIC}') "
    "|| self.cells.exists(c, has(c.shadow) && c.shadow.exists(x, x > 0.0))",
    holds=lambda s: (
        s.analysis is None
        or not any(m.name == SHADOW_METRIC for m in s.analysis.metrics)
        or any(any(x > 0 for x in c.shadow or ()) for c in s.cells)
    ),
    message="shadow-agreement judges mirrored requests: give a cell a shadow share above 0 (cells[].shadow)",
)

#: A GrayReleaseSpec rule: an analysis reading the engines' metrics needs the candidate's engine.
ENGINE_METRICS_RULE = Rule(
    cel="!has(self.analysis) || !has(self.analysis.metrics) || "
    f"!self.analysis.metrics.exists(m, m.name in {_cel_list(ENGINE_METRICS)}) "
    "|| has(self.candidate.engine) || (has(self.candidate.adapter) && has(self.stable.engine))",
    holds=lambda s: (
        s.analysis is None
        or not any(m.name in ENGINE_METRICS for m in s.analysis.metrics)
        or s.candidate.engine is not None
    ),
    message="engine metrics (queue-depth, kv-cache-usage, prefix-cache-hit-rate) need spec.candidate.engine "
    "(an adapter candidate's is stable.engine)",
)
