"""GrayRelease: move traffic from a stable backend to a candidate, dye cell by dye cell."""

from __future__ import annotations

import re
from datetime import datetime
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Field

from tinct.api.v1alpha1.autoscaling import LABEL_NAME, Autoscaling, Keda, KedaSide, ScaleMetric
from tinct.api.v1alpha1.common import DNS_NAME, Condition, Model, Resource, defaulted
from tinct.api.v1alpha1.prometheus import PrometheusRef
from tinct.api.v1alpha1.rules import Rule, cel, strictly_increasing

__all__ = [
    "Autoscaling",
    "Backend",
    "Engine",
    "GrayRelease",
    "GrayReleaseSpec",
    "GrayReleaseStatus",
    "Keda",
    "KedaSide",
    "PrometheusRef",
    "ScaleMetric",
    "ScalerStatus",
]

GrayReleasePhase = Literal["Pending", "Progressing", "Paused", "Promoted", "RolledBack", "Failed"]

Name = Annotated[str, Field(pattern=DNS_NAME, min_length=1, max_length=253)]
#: A dye value: a bucket, role or latency class name. ``*`` is reserved for wildcards.
DyeValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", max_length=63)]
DyeMatch = Annotated[str, Field(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,62})$", max_length=63)]
HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9-]+$", min_length=1, max_length=128)]
Weight = Annotated[float, Field(ge=0, le=100)]
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


class Bucket(Model):
    name: DyeValue
    max_tokens: int | None = Field(
        default=None, ge=1, description="Upper bound (inclusive); omit on the last, catch-all bucket."
    )


_BOUNDED = "self.buckets.filter(b, has(b.maxTokens))"


class PromptLength(Model):
    model_config = cel(
        Rule(
            cel="self.buckets.all(b, self.buckets.exists_one(o, o.name == b.name))",
            holds=lambda s: len({b.name for b in s.buckets}) == len(s.buckets),
            message="bucket names must be unique",
            field_path=".buckets",
        ),
        Rule(
            cel="!has(self.buckets[size(self.buckets) - 1].maxTokens)",
            holds=lambda s: s.buckets[-1].max_tokens is None,
            message="the last bucket is the catch-all: leave its maxTokens out",
            field_path=".buckets",
        ),
        Rule(
            cel="self.buckets.filter(b, !has(b.maxTokens)).size() <= 1",
            holds=lambda s: sum(b.max_tokens is None for b in s.buckets) <= 1,
            message="only the last bucket may leave maxTokens out",
            field_path=".buckets",
        ),
        Rule(
            # Sorted, and no bound twice: strictly increasing.
            cel=f"{_BOUNDED}.map(b, b.maxTokens).isSorted() && "
            f"{_BOUNDED}.all(x, {_BOUNDED}.exists_one(o, o.maxTokens == x.maxTokens))",
            holds=lambda s: strictly_increasing(b.max_tokens for b in s.buckets if b.max_tokens is not None),
            message="bucket maxTokens must strictly increase from one bucket to the next",
            field_path=".buckets",
        ),
    )

    buckets: list[Bucket] = Field(min_length=1, max_length=16)
    chars_per_token: float = Field(default=4.0, gt=0, le=64, description="Token estimate divisor.")


_DEFAULT_LISTED = Rule(
    cel="self.default in self.values",
    holds=lambda s: s.default in s.values,
    message="default must be one of values",
)


class RoleDye(Model):
    model_config = cel(_DEFAULT_LISTED)

    header: HeaderName = Field(
        default="X-User-Role",
        description="Header carrying the caller's role, set by a gateway; the router believes it only "
        "from peers it is told to trust (tinct router --trust-role-from).",
    )
    values: list[DyeValue] = Field(default_factory=lambda: ["user"], min_length=1, max_length=32)
    default: DyeValue = "user"


class LatencyDye(Model):
    model_config = cel(
        _DEFAULT_LISTED,
        Rule(
            cel="!has(self.streamClass) || self.streamClass in self.values",
            holds=lambda s: s.stream_class is None or s.stream_class in s.values,
            message="streamClass must be one of values",
        ),
    )

    header: HeaderName = "X-Latency-Class"
    values: list[DyeValue] = Field(default_factory=lambda: ["low", "high"], min_length=1, max_length=16)
    default: DyeValue = "low"
    stream_class: DyeValue | None = Field(
        default=None, description="Class given to requests with stream: true and no header."
    )


class StickyKey(Model):
    header: HeaderName = Field(
        default="X-Session-Id", description="Requests with the same value land on the same side."
    )


class Dye(Model):
    prompt_length: PromptLength
    role: RoleDye = defaulted(RoleDye)
    latency: LatencyDye = defaulted(LatencyDye)
    sticky_key: StickyKey = defaulted(StickyKey)


class CellMatch(Model):
    """Which requests a cell takes; an omitted field or ``*`` matches anything."""

    prompt_length: DyeMatch | None = None
    role: DyeMatch | None = None
    latency: DyeMatch | None = None


class Cell(Model):
    model_config = cel(
        Rule(
            cel="self.weights.isSorted()",
            holds=lambda s: all(a <= b for a, b in pairwise(s.weights)),
            message="weights must never decrease from one step to the next",
            field_path=".weights",
        ),
    )

    match: CellMatch = defaulted(CellMatch)
    weights: list[Weight] = Field(
        min_length=1,
        max_length=64,
        description="Percent of this cell's traffic sent to the candidate at each step.",
    )


def _wild(value: str | None) -> bool:
    return value is None or value == "*"


def _is_default(match: CellMatch) -> bool:
    return _wild(match.prompt_length) and _wild(match.role) and _wild(match.latency)


_IS_DEFAULT_CELL = (
    "(!has(c.match.promptLength) || c.match.promptLength == '*') && "
    "(!has(c.match.role) || c.match.role == '*') && "
    "(!has(c.match.latency) || c.match.latency == '*')"
)

#: Rules over ``dye`` and ``cells[].match`` only, shared by GrayReleaseSpec and the routing table.
CELL_RULES = (
    Rule(
        cel=f"self.cells.filter(c, {_IS_DEFAULT_CELL}).size() == 1",
        holds=lambda s: sum(_is_default(c.match) for c in s.cells) == 1,
        message="exactly one default cell (match: {}) is required",
        field_path=".cells",
    ),
    Rule(
        cel="self.cells.all(c, !has(c.match.promptLength) || c.match.promptLength == '*' || "
        "self.dye.promptLength.buckets.exists(b, b.name == c.match.promptLength))",
        holds=lambda s: all(
            _wild(c.match.prompt_length)
            or c.match.prompt_length in {b.name for b in s.dye.prompt_length.buckets}
            for c in s.cells
        ),
        message="a cell's match.promptLength must name a bucket of dye.promptLength",
        field_path=".cells",
    ),
    Rule(
        cel="self.cells.all(c, !has(c.match.role) || c.match.role == '*' || c.match.role in self.dye.role.values)",
        holds=lambda s: all(_wild(c.match.role) or c.match.role in s.dye.role.values for c in s.cells),
        message="a cell's match.role must be one of dye.role.values",
        field_path=".cells",
    ),
    Rule(
        cel="self.cells.all(c, !has(c.match.latency) || c.match.latency == '*' || "
        "c.match.latency in self.dye.latency.values)",
        holds=lambda s: all(
            _wild(c.match.latency) or c.match.latency in s.dye.latency.values for c in s.cells
        ),
        message="a cell's match.latency must be one of dye.latency.values",
        field_path=".cells",
    ),
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
    query: str | None = Field(default=None, max_length=4096, description="PromQL, for custom.")
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
        description=f"Length of each analysis window, e.g. 30s, 1m, 1m30s (at least {MIN_INTERVAL_SECONDS}s). "
        "A step's window starts when the routers serve its table.",
    )
    failure_limit: int = Field(
        default=2, ge=0, le=100, description="Failed analyses that roll the release back (0 acts as 1)."
    )
    prometheus: PrometheusRef = defaulted(PrometheusRef)
    metrics: list[Metric] = Field(default_factory=list, max_length=16)
    min_requests: int = Field(
        default=10,
        ge=0,
        le=10_000_000,
        description="Candidate requests needed in a window (per cell with perCell) for a verdict; "
        "fewer is inconclusive.",
    )
    inconclusive_limit: int = Field(
        default=10, ge=1, le=10000, description="Consecutive inconclusive analyses that pause the release."
    )
    per_cell: bool = Field(
        default=False,
        description="Judge the built-ins read from the routers (success-rate, latency-p95, ttft-p95, "
        "itl-p95, throttle-rate, contract-violations) per dye cell: every cell with minRequests "
        "must pass.",
    )


class Fallback(Model):
    consecutive_failures: int = Field(default=3, ge=1, le=1000)
    latency_ms: int = Field(default=800, ge=1, le=600000)
    cooldown_seconds: int = Field(default=30, ge=0, le=86400)
    idle_timeout_ms: int = Field(
        default=60000,
        ge=100,
        le=3600000,
        description="Longest silence of a backend mid-answer (after its headers) before the "
        "router cuts the client connection and counts a failure. Generous by default: tokens "
        "stream every few ms, but a long prompt's prefill may come after the headers.",
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


class GrayReleaseSpec(Model):
    model_config = cel(
        *CELL_RULES,
        Rule(
            cel="self.cells.all(c, size(c.weights) == size(self.cells[0].weights))",
            holds=lambda s: len({len(c.weights) for c in s.cells}) == 1,
            message="every cell needs the same number of weights (one per step)",
            field_path=".cells",
        ),
        Rule(
            cel="self.stable.service != self.candidate.service || self.stable.port != self.candidate.port",
            holds=lambda s: (s.stable.service, s.stable.port) != (s.candidate.service, s.candidate.port),
            message="stable and candidate must be different backends",
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
    )

    stable: Backend
    candidate: Backend
    models: list[ModelName] = Field(
        default_factory=list,
        max_length=32,
        description="OpenAI model names (the request's 'model') this release serves; default: "
        "the model of its ModelVersions. A router fronting several releases picks the "
        "release by it.",
    )
    dye: Dye
    cells: list[Cell] = Field(min_length=1, max_length=64)
    analysis: Analysis | None = None
    fallback: Fallback = defaulted(Fallback)
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="Scale the Deployments of both sides during the release (an HPA each, or a KEDA "
        "ScaledObject each with keda); none: tinct leaves replicas alone.",
    )
    paused: bool = False
    allow_major_upgrade: bool = Field(
        default=False,
        description="Release a candidate whose MAJOR semver differs from stable's (an API break).",
    )
    progress_deadline_seconds: int = Field(
        default=600,
        ge=10,
        le=604800,
        description="Seconds a release may be held without progress (preconditions unmet, "
        "analyses inconclusive, candidate replicas not available) before it is paused, or "
        "rolled back with progressDeadlineAbort.",
    )
    progress_deadline_abort: bool = Field(
        default=False,
        description="Roll back, instead of pausing, a release past its progressDeadlineSeconds.",
    )
    route_on_delete: Literal["Keep", "Remove"] = Field(
        default="Keep",
        description="What deleting the release does to its model's route: Keep serves the "
        "model by the release's outcome (the candidate if Promoted, else stable) until another "
        "release takes the model over; Remove takes the route away, and the model's requests "
        "get 404.",
    )


Verdict = Literal["Pass", "Fail", "Error", "Inconclusive"]


class MetricResult(Model):
    name: str
    value: float | None = None
    threshold: str
    verdict: Verdict
    message: str | None = None
    stable_value: float | None = Field(default=None, description="The same metric of stable, if compared.")
    series: str | None = Field(
        default=None,
        description="Engine metrics: the engine series the value was read from, of the names "
        "the engine is known by (e.g. vllm:gpu_cache_usage_perc for a vLLM before 0.9).",
    )


class CellResult(Model):
    """Verdict of one dye cell when the analysis is per cell."""

    cell: str
    requests: float = 0
    verdict: Verdict
    metrics: list[MetricResult] = Field(default_factory=list)


class AnalysisResult(Model):
    time: datetime
    verdict: Verdict
    metrics: list[MetricResult] = Field(default_factory=list)
    step: int | None = Field(default=None, ge=0, description="The step this analysis judged.")
    requests: float | None = Field(default=None, description="Candidate requests in the window.")
    message: str | None = None
    cells: list[CellResult] = Field(default_factory=list)


class ScalerStatus(Model):
    """What scales one backend's Deployment: tinct's HPA, or tinct's KEDA ScaledObject and the HPA
    KEDA keeps for it, with the bounds tinct set."""

    side: Literal["stable", "candidate"]
    hpa: str = Field(
        description="The HorizontalPodAutoscaler scaling the side: tinct's, or the one KEDA keeps "
        "for the ScaledObject."
    )
    scaled_object: str | None = Field(
        default=None, description="The KEDA ScaledObject tinct writes for the side (autoscaling.keda)."
    )
    query: str | None = Field(
        default=None,
        max_length=8192,
        description="The PromQL the side scales on (autoscaling.keda): replicas = ceil(value / "
        "targetPerReplica).",
    )
    min_replicas: int = Field(description="Fewest replicas tinct allows the side now.")
    max_replicas: int = Field(description="Most replicas tinct allows the side now.")
    managed: bool = Field(
        default=True,
        description="False when an HPA or ScaledObject tinct did not create targets the Deployment, "
        "or KEDA is not installed: tinct then leaves the side alone.",
    )


class RoutingRef(Model):
    config_map: str
    namespace: str | None = Field(default=None, description="Namespace of the routing-table ConfigMap.")
    version: int = Field(ge=0, description="Version of the table written for this status.")
    digest: str | None = Field(
        default=None, description="Digest of the table's content (all but its version)."
    )
    models: list[str] = Field(default_factory=list, max_length=32, description="The models the table serves.")
    confirmed_at: datetime | None = Field(
        default=None,
        description="When every router was first seen serving this version; a step's analysis "
        "window starts there.",
    )


ActionResult = Literal["Done", "Refused"]


class ActionRecord(Model):
    """What became of the last tinct.io/action request."""

    value: str = Field(max_length=256)
    result: ActionResult
    message: str = Field(default="", max_length=1024)
    time: datetime | None = None


class HistoryEntry(Model):
    """A transition recorded in status and not yet written to ``release_events``."""

    seq: int = Field(ge=0)
    reason: str
    message: str = Field(default="", max_length=2000)
    phase: GrayReleasePhase
    step: int = Field(ge=0)
    weights: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    time: datetime


class GrayReleaseStatus(Model):
    phase: GrayReleasePhase = "Pending"
    step: int = Field(default=0, ge=0)
    message: str | None = None
    observed_generation: int | None = None
    weights: dict[str, float] = Field(default_factory=dict)
    failed_analyses: int = Field(default=0, ge=0)
    last_analysis: AnalysisResult | None = None
    routing: RoutingRef | None = None
    conditions: list[Condition] = Field(default_factory=list)
    inconclusive_analyses: int = Field(default=0, ge=0, description="Consecutive inconclusive analyses.")
    step_started_at: datetime | None = Field(
        default=None, description="When the current step (or Promoted/RolledBack) began."
    )
    pause_reason: str | None = Field(
        default=None, description="Why the operator paused the release; `tinct release resume` clears it."
    )
    acknowledged_action: str | None = Field(
        default=None, description="The last tinct.io/action annotation value carried out."
    )
    transitions: int = Field(default=0, ge=0, description="Transitions so far; keys the history rows.")
    autoscaling: list[ScalerStatus] = Field(default_factory=list)
    released: str | None = Field(
        default=None,
        description="The `stable -> candidate` ModelVersions this status is about; a spec naming "
        "others starts the release over.",
    )
    target: str | None = Field(
        default=None,
        description="Digest of what is released (both sides' Services, ports, Deployments, URLs, "
        "scheduler versions and ModelVersion digests); a change starts the release over.",
    )
    attempt: int = Field(
        default=0, ge=0, description="Counts the starts of this release (a retry or restart is a new one)."
    )
    last_action: ActionRecord | None = None
    seen_actions: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="tinct.io/action values already handled; seen again, they are refused.",
    )
    blocked_since: datetime | None = Field(
        default=None,
        description="Since when the release is held without progress (see progressDeadlineSeconds).",
    )
    next_step: int | None = Field(
        default=None,
        ge=0,
        description="A step decided on whose weights wait for the candidate's available replicas; "
        "the number of steps stands for promotion.",
    )
    stable_floor: int | None = Field(
        default=None, ge=0, description="Stable's replicas when the release started; kept until promotion."
    )
    history: list[HistoryEntry] = Field(
        default_factory=list,
        max_length=64,
        description="Transitions recorded here and not yet in the release_events table.",
    )
    progress: str | None = Field(default=None, description="The step as shown: `2/4` is the second of four.")
    candidate_weight: float = Field(
        default=0, ge=0, le=100, description="The largest candidate weight of any cell in force."
    )


class GrayRelease(Resource[GrayReleaseSpec, GrayReleaseStatus]):
    kind: Literal["GrayRelease"] = "GrayRelease"
