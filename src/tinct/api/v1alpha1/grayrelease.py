"""GrayRelease: move traffic from a stable backend to a candidate, dye cell by dye cell."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from tinct.api.v1alpha1.common import API_VERSION, DNS_NAME, Condition, Model, ObjectMeta, cel, defaulted

GrayReleasePhase = Literal["Pending", "Progressing", "Paused", "Promoted", "RolledBack", "Failed"]

Name = Annotated[str, Field(pattern=DNS_NAME, min_length=1, max_length=253)]
#: A dye value: a bucket, role or latency class name. ``*`` is reserved for wildcards.
DyeValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", max_length=63)]
DyeMatch = Annotated[str, Field(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,62})$", max_length=63)]
HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9-]+$", min_length=1, max_length=128)]
Weight = Annotated[float, Field(ge=0, le=100)]
Duration = Annotated[str, Field(pattern=r"^([0-9]+(ms|s|m|h))+$", max_length=32)]


class Backend(Model):
    """One side of the release: a scheduler behind a Service."""

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


class Bucket(Model):
    name: DyeValue
    max_tokens: int | None = Field(
        default=None, ge=1, description="Upper bound (inclusive); omit on the last, catch-all bucket."
    )


class PromptLength(Model):
    model_config = cel(
        {
            "rule": "self.buckets.all(b, self.buckets.exists_one(o, o.name == b.name))",
            "message": "bucket names must be unique",
            "fieldPath": ".buckets",
        },
        {
            "rule": "!has(self.buckets[size(self.buckets) - 1].maxTokens)",
            "message": "the last bucket is the catch-all: leave its maxTokens out",
            "fieldPath": ".buckets",
        },
        {
            "rule": "self.buckets.filter(b, has(b.maxTokens)).map(b, b.maxTokens).isSorted()",
            "message": "bucket maxTokens must increase from one bucket to the next",
            "fieldPath": ".buckets",
        },
    )

    buckets: list[Bucket] = Field(min_length=1, max_length=16)
    chars_per_token: float = Field(default=4.0, gt=0, le=64, description="Token estimate divisor.")


class RoleDye(Model):
    model_config = cel({"rule": "self.default in self.values", "message": "default must be one of values"})

    header: HeaderName = Field(
        default="X-User-Role",
        description="Header carrying the caller's role, set by a gateway; the router believes it only "
        "from peers it is told to trust (tinct router --trust-role-from).",
    )
    values: list[DyeValue] = Field(default_factory=lambda: ["user"], min_length=1, max_length=32)
    default: DyeValue = "user"


class LatencyDye(Model):
    model_config = cel(
        {"rule": "self.default in self.values", "message": "default must be one of values"},
        {
            "rule": "!has(self.streamClass) || self.streamClass in self.values",
            "message": "streamClass must be one of values",
        },
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
        {
            "rule": "self.weights.isSorted()",
            "message": "weights must never decrease from one step to the next",
            "fieldPath": ".weights",
        },
    )

    match: CellMatch = defaulted(CellMatch)
    weights: list[Weight] = Field(
        min_length=1,
        max_length=64,
        description="Percent of this cell's traffic sent to the candidate at each step.",
    )


_IS_DEFAULT_CELL = (
    "(!has(c.match.promptLength) || c.match.promptLength == '*') && "
    "(!has(c.match.role) || c.match.role == '*') && "
    "(!has(c.match.latency) || c.match.latency == '*')"
)


class PrometheusRef(Model):
    url: str = Field(pattern=r"^https?://.+", max_length=2048)


class Metric(Model):
    """A health check of the candidate, evaluated at every analysis interval."""

    model_config = cel(
        {"rule": "self.name != 'custom' || has(self.query)", "message": "a custom metric needs a query"},
        {"rule": "self.name == 'custom' || !has(self.query)", "message": "only custom metrics take a query"},
        {
            "rule": "has(self.min) || has(self.max) || has(self.maxMs)",
            "message": "give a threshold: min, max or maxMs",
        },
    )

    name: Literal["success-rate", "latency-p95", "custom"] = Field(
        description="success-rate and latency-p95 are computed from router metrics for the candidate."
    )
    min: float | None = Field(default=None, description="Fail when the value is below.")
    max: float | None = Field(default=None, description="Fail when the value is above.")
    max_ms: float | None = Field(default=None, gt=0, description="latency-p95: fail above this.")
    query: str | None = Field(default=None, max_length=4096, description="PromQL, for custom.")
    max_stable_delta: float | None = Field(
        default=None,
        ge=0,
        description="success-rate / latency-p95: also fail when the candidate is worse than stable over "
        "the same window by more than this (percentage points / milliseconds).",
    )


class Analysis(Model):
    interval: Duration = "1m"
    failure_limit: int = Field(
        default=2, ge=0, le=100, description="Failed analyses that roll the release back (0 acts as 1)."
    )
    prometheus: PrometheusRef
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
        description="Judge success-rate and latency-p95 per dye cell: every cell with minRequests must pass.",
    )


class Fallback(Model):
    consecutive_failures: int = Field(default=3, ge=1, le=1000)
    latency_ms: int = Field(default=800, ge=1, le=600000)
    cooldown_seconds: int = Field(default=30, ge=0, le=86400)


class ScaleMetric(Model):
    pods: str = Field(default="http_requests_total", max_length=253)
    average_value: str = Field(default="250", pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G)?$", max_length=32)


class Autoscaling(Model):
    model_config = cel(
        {"rule": "self.minReplicas <= self.maxReplicas", "message": "minReplicas must be <= maxReplicas"}
    )

    min_replicas: int = Field(default=1, ge=1, le=10000)
    max_replicas: int = Field(default=10, ge=1, le=10000)
    metric: ScaleMetric = defaulted(ScaleMetric)


class GrayReleaseSpec(Model):
    model_config = cel(
        {
            "rule": f"self.cells.filter(c, {_IS_DEFAULT_CELL}).size() == 1",
            "message": "exactly one default cell (match: {}) is required",
            "fieldPath": ".cells",
        },
        {
            "rule": "self.cells.all(c, size(c.weights) == size(self.cells[0].weights))",
            "message": "every cell needs the same number of weights (one per step)",
            "fieldPath": ".cells",
        },
        {
            "rule": "self.cells.all(c, !has(c.match.promptLength) || c.match.promptLength == '*' || "
            "self.dye.promptLength.buckets.exists(b, b.name == c.match.promptLength))",
            "message": "a cell's match.promptLength must name a bucket of dye.promptLength",
            "fieldPath": ".cells",
        },
        {
            "rule": "self.cells.all(c, !has(c.match.role) || c.match.role == '*' || "
            "c.match.role in self.dye.role.values)",
            "message": "a cell's match.role must be one of dye.role.values",
            "fieldPath": ".cells",
        },
        {
            "rule": "self.cells.all(c, !has(c.match.latency) || c.match.latency == '*' || "
            "c.match.latency in self.dye.latency.values)",
            "message": "a cell's match.latency must be one of dye.latency.values",
            "fieldPath": ".cells",
        },
        {
            "rule": "self.stable.service != self.candidate.service || self.stable.port != self.candidate.port",
            "message": "stable and candidate must be different backends",
        },
    )

    stable: Backend
    candidate: Backend
    dye: Dye
    cells: list[Cell] = Field(min_length=1, max_length=64)
    analysis: Analysis | None = None
    fallback: Fallback = defaulted(Fallback)
    autoscaling: Autoscaling | None = None
    paused: bool = False
    allow_major_upgrade: bool = Field(
        default=False,
        description="Release a candidate whose MAJOR semver differs from stable's (an API break).",
    )


Verdict = Literal["Pass", "Fail", "Error", "Inconclusive"]


class MetricResult(Model):
    name: str
    value: float | None = None
    threshold: str
    verdict: Verdict
    message: str | None = None
    stable_value: float | None = Field(default=None, description="The same metric of stable, if compared.")


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
    """The bounds tinct set on one backend's HorizontalPodAutoscaler."""

    side: Literal["stable", "candidate"]
    hpa: str
    min_replicas: int
    max_replicas: int
    managed: bool = Field(default=True, description="False when another HPA targets the Deployment.")


class RoutingRef(Model):
    config_map: str
    version: int = Field(ge=0)


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


class GrayRelease(Model):
    api_version: str = API_VERSION
    kind: Literal["GrayRelease"] = "GrayRelease"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GrayReleaseSpec
    status: GrayReleaseStatus | None = None
