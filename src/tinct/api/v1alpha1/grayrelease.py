"""GrayRelease: move traffic from a stable backend to a candidate, dye cell by dye cell.

The dye and the cells live in :mod:`tinct.api.v1alpha1.dye`, the status in
:mod:`tinct.api.v1alpha1.releasestatus`; their names are re-exported here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field

from tinct.api.v1alpha1.autoscaling import LABEL_NAME, Autoscaling, Keda, KedaSide, ScaleMetric
from tinct.api.v1alpha1.common import DNS_NAME, Model, Resource, defaulted
from tinct.api.v1alpha1.dye import (
    CELL_RULES,
    Bucket,
    Cell,
    CellMatch,
    Dye,
    DyeMatch,
    DyeValue,
    HeaderName,
    LatencyDye,
    PromptLength,
    RoleDye,
    StickyKey,
    Weight,
    cell_key,
    first_cell,
    first_failing,
)
from tinct.api.v1alpha1.prometheus import PrometheusRef
from tinct.api.v1alpha1.releasestatus import (
    READABLE_DIGITS,
    ActionRecord,
    ActionResult,
    AnalysisResult,
    CellResult,
    GrayReleasePhase,
    GrayReleaseStatus,
    HistoryEntry,
    MetricResult,
    Readable,
    RoutingRef,
    ScalerStatus,
    Verdict,
    readable,
)
from tinct.api.v1alpha1.rules import Rule, cel, cel_format

__all__ = [
    "CELL_RULES",
    "ENGINE_METRICS",
    "MIN_INTERVAL_SECONDS",
    "QUANTILE_METRICS",
    "READABLE_DIGITS",
    "ROUTER_METRICS",
    "ActionRecord",
    "ActionResult",
    "Analysis",
    "AnalysisResult",
    "Autoscaling",
    "Backend",
    "Bucket",
    "Cell",
    "CellMatch",
    "CellResult",
    "Dye",
    "DyeMatch",
    "DyeValue",
    "Engine",
    "Fallback",
    "GrayRelease",
    "GrayReleasePhase",
    "GrayReleaseSpec",
    "GrayReleaseStatus",
    "HeaderName",
    "HistoryEntry",
    "Keda",
    "KedaSide",
    "LatencyDye",
    "Metric",
    "MetricName",
    "MetricResult",
    "NotifyRef",
    "PrometheusRef",
    "PromptLength",
    "Readable",
    "RoleDye",
    "RoutingRef",
    "ScaleMetric",
    "ScalerStatus",
    "StickyKey",
    "TransitionReason",
    "Verdict",
    "Weight",
    "cell_key",
    "parse_duration",
    "readable",
]

Name = Annotated[str, Field(pattern=DNS_NAME, min_length=1, max_length=253)]
Duration = Annotated[str, Field(pattern=r"^([0-9]+(ms|s|m|h))+$", max_length=32)]

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


#: An OpenAI ``model`` value as clients send it.
ModelName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\s]+$")]


#: The serving engines whose metrics tinct knows by name (release analysis, KEDA scaling).
Engine = Literal["vllm", "sglang", "tgi"]


class Backend(Model):
    """One side of the release: a scheduler behind a Service."""

    model_config = cel(
        Rule(
            cel=f"!has(self.metricsSelector) || self.metricsSelector.all(k, k.matches('{LABEL_NAME}'))",
            holds=lambda s: (
                s.metrics_selector is None or all(re.match(LABEL_NAME, k) for k in s.metrics_selector)
            ),
            message="metricsSelector keys must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*)",
            field_path=".metricsSelector",
        )
    )

    model_version: Name = Field(description="Name of the ModelVersion served by this backend.")
    service: Name = Field(description="Service the router sends this side's traffic to.")
    port: int = Field(ge=1, le=65535, description="Service port.")
    deployment: Name | None = Field(
        default=None, description="Deployment scaled by the HPA tinct manages; none if omitted."
    )
    scheduler_version: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=63,
        description="Sent as X-Scheduler-Version; a backend answering 426 rejects it.",
    )
    url: str | None = Field(
        default=None,
        pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?$",
        max_length=512,
        description="Base URL routers use instead of the Service's cluster DNS name, e.g. for a "
        "backend outside the cluster; the Service must still exist.",
    )
    engine: Engine | None = Field(
        default=None,
        description="The serving engine behind this side, whose own /metrics Prometheus scrapes: "
        "the engine metrics of the analysis and KEDA scaling (autoscaling.keda) read its series "
        "under its names: vllm (vllm:num_requests_waiting, vllm:kv_cache_usage_perc or before 0.9 "
        "vllm:gpu_cache_usage_perc, vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total "
        "or vllm:gpu_prefix_cache_*), sglang (sglang:num_queue_reqs, sglang:token_usage, "
        "sglang:cached_tokens_total / sglang:prompt_tokens_total or sglang:cache_hit_rate; or "
        "their sglang_ forms), tgi (tgi_queue_size; no KV-cache or prefix-cache metric). None: "
        "no engine metrics.",
    )
    metrics_selector: dict[str, Annotated[str, Field(max_length=256)]] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description="Prometheus labels, exact values, that select this side's engine series "
        "and no other's for the analysis' engine metrics (queue-depth, kv-cache-usage, "
        "prefix-cache-hit-rate; on stable, for their maxStableDelta). Default: namespace (the "
        "release's) and service (this side's Service), as autoscaling.keda's labels.",
    )


#: The built-in metrics read from the routers' metrics, per dye cell.
ROUTER_METRICS = (
    "success-rate",
    "latency-p95",
    "ttft-p95",
    "itl-p95",
    "throttle-rate",
    "contract-violations",
)
#: The built-in metrics read from the engines' own metrics (``engine`` on each side).
ENGINE_METRICS = ("queue-depth", "kv-cache-usage", "prefix-cache-hit-rate")
#: The built-ins judged on a quantile of a histogram, in milliseconds.
QUANTILE_METRICS = ("latency-p95", "ttft-p95", "itl-p95")
MetricName = Literal[
    "success-rate",
    "latency-p95",
    "ttft-p95",
    "itl-p95",
    "throttle-rate",
    "contract-violations",
    "queue-depth",
    "kv-cache-usage",
    "prefix-cache-hit-rate",
    "custom",
]


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
    )

    name: MetricName = Field(
        description="What is judged, for the candidate. From the routers' metrics of this release "
        "(per dye cell with perCell): success-rate (percent of the requests the candidate got "
        "answered whole and without a 5xx; fallbacks count against it, a 429 does not), "
        "latency-p95 (ms, time to first byte, tinct_router_time_to_first_byte_seconds), ttft-p95 "
        "(ms, time to first token: to the first SSE event carrying content, or to the whole "
        "answer when not streamed, tinct_router_time_to_first_token_seconds), itl-p95 (ms, "
        "inter-token latency, tinct_router_inter_token_latency_seconds), throttle-rate (percent "
        "of the candidate's requests answered 429, tinct_router_requests_total), "
        "contract-violations (OpenAI API contract violations per 100 answers of the candidate, "
        "tinct_router_contract_violations_total). From the engines' own metrics through "
        "Prometheus (spec.candidate.engine, and its metricsSelector): queue-depth (requests waiting "
        "in the engine's queue, mean over the window and the candidate's engines), "
        "kv-cache-usage (percent of the KV cache in use, mean over the window and engines), "
        "prefix-cache-hit-rate (percent of prompt tokens found in the prefix cache over the "
        "window). custom: the PromQL in query.",
    )
    min: float | None = Field(
        default=None,
        description="Fail when the value is below (in the metric's unit: percent, ms, requests).",
    )
    max: float | None = Field(
        default=None,
        description="Fail when the value is above (in the metric's unit: percent, ms, requests).",
    )
    max_ms: float | None = Field(
        default=None, gt=0, description="latency-p95, ttft-p95, itl-p95: fail above this many milliseconds."
    )
    quantile: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="latency-p95, ttft-p95, itl-p95: the quantile judged instead of 0.95 "
        "(e.g. 0.99), interpolated within the histogram's buckets as histogram_quantile does.",
    )
    query: str | None = Field(
        default=None,
        max_length=4096,
        description="custom: a PromQL expression returning one number; $namespace, $release and "
        "$interval are replaced.",
    )
    max_stable_delta: float | None = Field(
        default=None,
        ge=0,
        description="Built-ins: also fail when the candidate is worse than stable over the same "
        "window by more than this, in the metric's unit: percentage points (success-rate, "
        "throttle-rate, contract-violations, kv-cache-usage, prefix-cache-hit-rate), "
        "milliseconds (latency-p95, ttft-p95, itl-p95), requests (queue-depth). Router metrics "
        "are compared cell by cell; engine metrics need stable's engine.",
    )


class Analysis(Model):
    """How each step's window is judged. analysis: {} names no metrics: every step then moves
    on after interval without judging the candidate."""

    model_config = cel(
        Rule(
            cel=f"duration(self.interval) >= duration('{MIN_INTERVAL_SECONDS}s')",
            holds=lambda s: parse_duration(s.interval) >= MIN_INTERVAL_SECONDS,
            message=f"interval must be at least {MIN_INTERVAL_SECONDS}s",
            field_path=".interval",
        )
    )

    interval: Duration = Field(
        default="1m",
        description="Duration of each analysis window, e.g. 30s, 1m, 1m30s (default 1m, at least "
        f"{MIN_INTERVAL_SECONDS}s). A step's window starts when the routers serve its table; "
        "without metrics, each step lasts this long.",
    )
    failure_limit: int = Field(
        default=2,
        ge=0,
        le=100,
        description="Failed analyses that roll the release back (default 2; 0 acts as 1).",
    )
    prometheus: PrometheusRef = defaulted(PrometheusRef)
    metrics: list[Metric] = Field(
        default_factory=list,
        max_length=16,
        description="What the candidate is held to at each window (up to 16); each must pass for the "
        "release to step forward. Empty: no judgement, steps move on after interval.",
    )
    min_requests: int = Field(
        default=10,
        ge=0,
        le=10_000_000,
        description="Candidate requests needed in a window (per cell with perCell) for a verdict "
        "(default 10); fewer is inconclusive.",
    )
    inconclusive_limit: int = Field(
        default=10,
        ge=1,
        le=10000,
        description="Consecutive inconclusive analyses that pause the release (default 10).",
    )
    per_cell: bool = Field(
        default=False,
        description="Judge the built-ins read from the routers (success-rate, latency-p95, ttft-p95, "
        "itl-p95, throttle-rate, contract-violations) per dye cell: every cell with minRequests "
        "must pass (default false).",
    )


class Fallback(Model):
    """When the router sends a candidate's request to stable instead, in the same request, and
    when it stops trying the candidate for a while."""

    consecutive_failures: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Candidate failures in a row after which the router ejects it for cooldownSeconds "
        "(default 3).",
    )
    latency_ms: int = Field(
        default=800,
        ge=1,
        le=600000,
        description="Milliseconds the candidate may take to answer its headers before the request goes "
        "to stable (default 800).",
    )
    cooldown_seconds: int = Field(
        default=30,
        ge=0,
        le=86400,
        description="Seconds an ejected candidate gets no requests (default 30); keep "
        "analysis.interval longer.",
    )
    idle_timeout_ms: int = Field(
        default=60000,
        ge=100,
        le=3600000,
        description="Longest silence in milliseconds of a backend mid-answer (after its headers) before "
        "the router cuts the client connection and counts a failure (default 60000). Generous: tokens "
        "stream every few ms, but a long prompt's prefill may come after the headers.",
    )


#: The transitions a release may be notified of (spec.notify[].on).
TransitionReason = Literal[
    "Started",
    "StepAdvanced",
    "Paused",
    "Resumed",
    "Promoted",
    "RolledBack",
    "Aborted",
    "ProgressDeadlineExceeded",
    "CandidateUnavailable",
    "Failed",
    "Recovered",
    "Restarted",
    "Retried",
]


class NotifyRef(Model):
    """A webhook of the operator's configuration that hears of this release's transitions."""

    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="Name of a notifier the operator is configured with (tinct operator --notifier "
        "NAME=TYPE:URL, the chart's operator.notifiers); one it does not have sets "
        "NotificationsReady=False.",
    )
    on: list[TransitionReason] = Field(
        default_factory=list,
        max_length=16,
        description="Only these transitions, e.g. [Promoted, RolledBack, Failed]; empty (the "
        "default): every transition.",
    )


def _keda_signal(side: str) -> Rule:
    """A side KEDA scales needs something to scale on: its engine's queue, or a query of its own."""

    def holds(s: GrayReleaseSpec) -> bool:
        keda = s.autoscaling.keda if s.autoscaling else None
        backend: Backend = getattr(s, side)
        if keda is None or backend.deployment is None:
            return True
        return backend.engine is not None or getattr(keda, side).query is not None

    return Rule(
        cel=f"!has(self.autoscaling) || !has(self.autoscaling.keda) || !has(self.{side}.deployment) || "
        f"has(self.{side}.engine) || has(self.autoscaling.keda.{side}.query)",
        holds=holds,
        message=f"autoscaling.keda scales {side} on its engine's queue: name {side}.engine, or give "
        f"autoscaling.keda.{side}.query",
    )


def _describe_uneven(s: Any) -> str:
    n = len(s.cells[0].weights)
    i = first_cell(s.cells, lambda c: len(c.weights) == n)
    return (
        f"cells[{i}] has {len(s.cells[i].weights)} weights but cells[0] has {n}: "
        "give every cell one weight per step"
    )


_EVEN = "size(c.weights) == size(self.cells[0].weights)"
_UNEVEN = first_failing(_EVEN)


class GrayReleaseSpec(Model):
    """What a GrayRelease moves (stable to candidate), by which dye cells and steps, judged by
    which analysis."""

    model_config = cel(
        *CELL_RULES,
        Rule(
            cel=f"self.cells.all(c, {_EVEN})",
            holds=lambda s: len({len(c.weights) for c in s.cells}) == 1,
            message="every cell needs the same number of weights (one per step)",
            field_path=".cells",
            message_expression=cel_format(
                "cells[%d] has %d weights but cells[0] has %d: give every cell one weight per step",
                _UNEVEN,
                f"size(self.cells[{_UNEVEN}].weights)",
                "size(self.cells[0].weights)",
            ),
            describe=_describe_uneven,
        ),
        Rule(
            cel="self.stable.service != self.candidate.service || self.stable.port != self.candidate.port",
            holds=lambda s: (s.stable.service, s.stable.port) != (s.candidate.service, s.candidate.port),
            message="stable and candidate must be different backends",
            message_expression=cel_format(
                "stable and candidate are both Service %s port %d: a release moves traffic between two "
                "different backends",
                "self.stable.service",
                "self.stable.port",
            ),
            describe=lambda s: (
                f"stable and candidate are both Service {s.stable.service} port {s.stable.port}: "
                "a release moves traffic between two different backends"
            ),
        ),
        Rule(
            cel="self.stable.modelVersion != self.candidate.modelVersion",
            holds=lambda s: s.stable.model_version != s.candidate.model_version,
            message="stable and candidate must be different ModelVersions",
            message_expression=cel_format(
                "stable and candidate are both ModelVersion %s: a release moves traffic from one version "
                "of a model to another",
                "self.stable.modelVersion",
            ),
            describe=lambda s: (
                f"stable and candidate are both ModelVersion {s.stable.model_version}: "
                "a release moves traffic from one version of a model to another"
            ),
        ),
        Rule(
            cel="!has(self.analysis) || !has(self.analysis.metrics) || "
            f"!self.analysis.metrics.exists(m, m.name in {_cel_list(ENGINE_METRICS)}) "
            "|| has(self.candidate.engine)",
            holds=lambda s: (
                s.analysis is None
                or not any(m.name in ENGINE_METRICS for m in s.analysis.metrics)
                or s.candidate.engine is not None
            ),
            message="engine metrics (queue-depth, kv-cache-usage, prefix-cache-hit-rate) need "
            "spec.candidate.engine",
        ),
        *(_keda_signal(side) for side in ("stable", "candidate")),
        Rule(
            cel="has(self.analysis)",
            holds=lambda s: s.analysis is not None,
            message="give spec.analysis: metrics that judge the candidate at each step, or "
            "analysis: {} to step forward every interval (1m) without judging it",
        ),
    )

    stable: Backend = Field(
        description="The backend serving today: it keeps the traffic cells do not send on."
    )
    candidate: Backend = Field(description="The backend the release moves traffic to, cell by cell.")
    models: list[ModelName] = Field(
        default_factory=list,
        max_length=32,
        description="OpenAI model names (the request's 'model') this release serves; default: "
        "the model of its ModelVersions. A router fronting several releases picks the "
        "release by it.",
    )
    dye: Dye = Field(
        description="How requests are classified into dye tags: prompt-length bucket x role x latency class."
    )
    cells: list[Cell] = Field(
        min_length=1,
        max_length=64,
        description="The dye cells (1 to 64), each with its own match and its candidate weight at each "
        "step; exactly one is the default (match: {}), and no two match alike.",
    )
    analysis: Analysis | None = Field(
        default=None,
        description="Required: the metrics that judge the candidate at each step, or analysis: {} to "
        "move on every interval without judging it.",
    )
    fallback: Fallback = defaulted(Fallback)
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="Scale the Deployments of both sides during the release (an HPA each, or a KEDA "
        "ScaledObject each with keda); none: tinct leaves replicas alone (CapacityReady says how "
        "many a step needs).",
    )
    notify: list[NotifyRef] = Field(
        default_factory=list,
        max_length=8,
        description="Webhooks (by their name in the operator's configuration) to post this "
        "release's transitions to: started, each step, paused, promoted, rolled back, failed.",
    )
    paused: bool = Field(
        default=False,
        description="true holds the release at its step (tinct release pause); false lets it go on "
        "(default false).",
    )
    allow_major_upgrade: bool = Field(
        default=False,
        description="Release a candidate whose MAJOR semver differs from stable's (an API break); "
        "default false.",
    )
    progress_deadline_seconds: int = Field(
        default=600,
        ge=10,
        le=604800,
        description="Seconds a release may be held without progress (preconditions unmet, "
        "analyses inconclusive, candidate replicas not available) before it is paused, or "
        "rolled back with progressDeadlineAbort (default 600).",
    )
    progress_deadline_abort: bool = Field(
        default=False,
        description="Roll back, instead of pausing, a release past its progressDeadlineSeconds "
        "(default false).",
    )
    route_on_delete: Literal["Keep", "Remove"] = Field(
        default="Keep",
        description="What deleting the release does to its model's route: Keep serves the "
        "model by the release's outcome (the candidate if Promoted, else stable) until another "
        "release takes the model over; Remove takes the route away, and the model's requests "
        "get 404 (default Keep).",
    )


class GrayRelease(Resource[GrayReleaseSpec, GrayReleaseStatus]):
    kind: Literal["GrayRelease"] = "GrayRelease"
