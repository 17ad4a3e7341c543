"""GrayRelease: move traffic from a stable backend to a candidate, dye cell by dye cell.

The sides live in :mod:`tinct.api.v1alpha1.backend`, the dye and the cells in
:mod:`tinct.api.v1alpha1.dye`, the analysis in :mod:`tinct.api.v1alpha1.analysis`, the
scaling in :mod:`tinct.api.v1alpha1.autoscaling` and the status in
:mod:`tinct.api.v1alpha1.releasestatus`; their names are re-exported here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tinct.api.v1alpha1.analysis import (
    ENGINE_METRICS,
    ENGINE_METRICS_RULE,
    MIN_INTERVAL_SECONDS,
    QUANTILE_METRICS,
    ROUTER_METRICS,
    SHADOW_METRIC,
    SHADOW_METRIC_RULE,
    Analysis,
    Metric,
    MetricName,
    parse_duration,
)
from tinct.api.v1alpha1.autoscaling import Autoscaling, Keda, KedaSide, ScaleMetric
from tinct.api.v1alpha1.backend import AdapterCandidate, Backend, Candidate, Engine, share_stable
from tinct.api.v1alpha1.common import Model, Resource, defaulted
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
    ADAPTER_ADDRESSES_LIMIT,
    ADAPTER_PODS_LIMIT,
    READABLE_DIGITS,
    ActionRecord,
    ActionResult,
    AdapterPod,
    AdapterPodState,
    AdapterRelease,
    AnalysisResult,
    CellResult,
    GrayReleasePhase,
    GrayReleaseStatus,
    HistoryEntry,
    MetricResult,
    Readable,
    RoutingRef,
    ScalerStatus,
    ShadowCell,
    ShadowResult,
    Verdict,
    readable,
)
from tinct.api.v1alpha1.rules import Rule, cel, cel_format
from tinct.api.v1alpha1.shadow import Judge, LengthRatio, Shadow, ShadowTable

__all__ = [
    "ADAPTER_ADDRESSES_LIMIT",
    "ADAPTER_PODS_LIMIT",
    "CELL_RULES",
    "ENGINE_METRICS",
    "MIN_INTERVAL_SECONDS",
    "QUANTILE_METRICS",
    "READABLE_DIGITS",
    "ROUTER_METRICS",
    "SHADOW_METRIC",
    "ActionRecord",
    "ActionResult",
    "AdapterCandidate",
    "AdapterPod",
    "AdapterPodState",
    "AdapterRelease",
    "Analysis",
    "AnalysisResult",
    "Autoscaling",
    "Backend",
    "Bucket",
    "Candidate",
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
    "Judge",
    "Keda",
    "KedaSide",
    "LatencyDye",
    "LengthRatio",
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
    "Shadow",
    "ShadowCell",
    "ShadowResult",
    "ShadowTable",
    "StickyKey",
    "TransitionReason",
    "Verdict",
    "Weight",
    "cell_key",
    "parse_duration",
    "readable",
]

#: An OpenAI ``model`` value as clients send it.
ModelName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\s]+$")]


class Fallback(Model):
    """When the router sends a candidate's request to stable instead, in the same request, and
    when it stops trying the candidate for a while."""

    consecutive_failures: int = Field(default=3, ge=1, le=1000)
    """Candidate failures in a row after which the router ejects it for cooldownSeconds (default 3)."""
    latency_ms: int = Field(default=800, ge=1, le=600000)
    """Milliseconds the candidate may take to answer its headers before the request goes to stable (default
    800)."""
    cooldown_seconds: int = Field(default=30, ge=0, le=86400)
    """Seconds an ejected candidate gets no requests (default 30); keep analysis.interval longer."""
    idle_timeout_ms: int = Field(default=60000, ge=100, le=3600000)
    """Longest silence in milliseconds of a backend mid-answer (after its headers) before the router cuts the
    client connection and counts a failure (default 60000). Generous: tokens stream every few ms, but a
    long prompt's prefill may come after the headers."""


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

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """Name of a notifier the operator is configured with (tinct operator --notifier NAME=TYPE:URL, the
    chart's operator.notifiers); one it does not have sets NotificationsReady=False."""
    on: list[TransitionReason] = Field(default_factory=list, max_length=16)
    """Only these transitions, e.g. [Promoted, RolledBack, Failed]; empty (the default): every transition."""


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
            cel="has(self.candidate.adapter) || self.stable.service != self.candidate.service || "
            "self.stable.port != self.candidate.port",
            holds=lambda s: (
                s.candidate.adapter is not None
                or (s.stable.service, s.stable.port) != (s.candidate.service, s.candidate.port)
            ),
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
            cel="self.stable.modelVersion != (has(self.candidate.adapter) ? "
            "self.candidate.adapter.modelVersion : self.candidate.modelVersion)",
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
        ENGINE_METRICS_RULE,
        SHADOW_METRIC_RULE,
        *(_keda_signal(side) for side in ("stable", "candidate")),
        Rule(
            cel="has(self.analysis)",
            holds=lambda s: s.analysis is not None,
            message="give spec.analysis: metrics that judge the candidate at each step, or "
            "analysis: {} to step forward every interval (1m) without judging it",
        ),
    )

    stable: Backend
    """The backend serving today: it keeps the traffic cells do not send on."""
    candidate: Candidate
    """The backend the release moves traffic to, cell by cell: a Service of its own, or a LoRA adapter loaded
    on stable's pods (adapter)."""
    models: list[ModelName] = Field(default_factory=list, max_length=32)
    """OpenAI model names (the request's 'model') this release serves; default: the model of its
    ModelVersions. A router fronting several releases picks the release by it."""
    dye: Dye
    """How requests are classified into dye tags: prompt-length bucket x role x latency class."""
    cells: list[Cell] = Field(min_length=1, max_length=64)
    """The dye cells (1 to 64), each with its own match and its candidate weight at each step; exactly one is
    the default (match: {}), and no two match alike."""
    analysis: Analysis | None = None
    """Required: the metrics that judge the candidate at each step, or analysis: {} to move on every interval
    without judging it."""
    fallback: Fallback = defaulted(Fallback)
    shadow: Shadow | None = None
    """Budgets of the mirrors of cells[].shadow and how their answers are compared (defaults apply when
    omitted): maxConcurrent, maxBytes, maxTokensPerMinute, timeoutSeconds, noiseShare, similarity,
    lengthRatio, keepText, maxTextBytes, judge."""
    autoscaling: Autoscaling | None = None
    """Scale the Deployments of both sides during the release (an HPA each, or a KEDA ScaledObject each with
    keda); none: tinct leaves replicas alone (CapacityReady says how many a step needs)."""
    notify: list[NotifyRef] = Field(default_factory=list, max_length=8)
    """Webhooks (by their name in the operator's configuration) to post this release's transitions to:
    started, each step, paused, promoted, rolled back, failed."""
    paused: bool = False
    """true holds the release at its step (tinct release pause); false lets it go on (default false)."""
    allow_major_upgrade: bool = False
    """Release a candidate whose MAJOR semver differs from stable's (an API break); default false."""
    progress_deadline_seconds: int = Field(default=600, ge=10, le=604800)
    """Seconds a release may be held without progress (preconditions unmet, analyses inconclusive, candidate
    replicas not available) before it is paused, or rolled back with progressDeadlineAbort (default 600)."""
    progress_deadline_abort: bool = False
    """Roll back, instead of pausing, a release past its progressDeadlineSeconds (default false)."""
    route_on_delete: Literal["Keep", "Remove"] = "Keep"
    """What deleting the release does to its model's route: Keep serves the model by the release's outcome
    (the candidate if Promoted, else stable) until another release takes the model over; Remove takes the
    route away, and the model's requests get 404 (default Keep)."""

    @model_validator(mode="before")
    @classmethod
    def _adapter_on_stable(cls, data: Any) -> Any:
        """An adapter candidate is served by stable's Service, pods and engine."""
        return share_stable(data)


class GrayRelease(Resource[GrayReleaseSpec, GrayReleaseStatus]):
    kind: Literal["GrayRelease"] = "GrayRelease"
