"""What the operator records in a GrayRelease's status: phase, step, weights, analyses,
routing, actions and the transitions not yet in the lineage tables."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from tinct.api.v1alpha1.action import SEEN_ACTIONS, VALUE_LIMIT
from tinct.api.v1alpha1.common import Condition, Model

__all__ = [
    "ADAPTER_ADDRESSES_LIMIT",
    "ADAPTER_PODS_LIMIT",
    "HISTORY_LIMIT",
    "READABLE_DIGITS",
    "ActionRecord",
    "ActionResult",
    "AdapterPod",
    "AdapterPodState",
    "AdapterRelease",
    "AnalysisResult",
    "CellResult",
    "GrayReleasePhase",
    "GrayReleaseStatus",
    "HistoryEntry",
    "MetricResult",
    "Readable",
    "RoutingRef",
    "ScalerStatus",
    "ShadowCell",
    "ShadowResult",
    "Verdict",
    "readable",
]

GrayReleasePhase = Literal["Pending", "Progressing", "Paused", "Promoted", "RolledBack", "Failed"]

Verdict = Literal["Pass", "Fail", "Error", "Inconclusive"]

#: Significant digits a measured number keeps in status: 99.8421, not 99.84210526315789.
READABLE_DIGITS = 6
#: Transitions kept in ``status.history`` until written to ``release_events`` (the field's bound).
HISTORY_LIMIT = 64


def readable(value: float | None) -> float | None:
    """``value`` rounded to :data:`READABLE_DIGITS` significant digits (NaN and inf kept)."""
    if value is None or not math.isfinite(value):
        return value
    return float(f"{value:.{READABLE_DIGITS}g}")


Readable = Annotated[float, AfterValidator(lambda v: readable(v))]
#: A ``tinct.io/action`` value as status records it (a longer one is cut with a digest).
ActionValue = Annotated[str, Field(max_length=VALUE_LIMIT)]


class MetricResult(Model):
    """One metric of one analysis: its value, the threshold, the verdict."""

    name: str
    """The metric: success-rate, latency-p95 or custom."""
    value: Readable | None = None
    """The candidate's value over the window (percent for success-rate, ms for latency-p95); absent when there
    was no data."""
    threshold: str
    """What the value was held to, e.g. `>= 99`."""
    verdict: Verdict
    """Pass, Fail, Inconclusive (too little data) or Error."""
    message: str | None = None
    """Why the verdict, when it is not Pass."""
    stable_value: Readable | None = None
    """The same metric of stable, if compared."""
    series: str | None = None
    """Engine metrics: the engine series the value was read from, of the names the engine is known by (e.g.
    vllm:gpu_cache_usage_perc for a vLLM before 0.9)."""


class CellResult(Model):
    """Verdict of one dye cell when the analysis is per cell."""

    cell: str
    """The cell, as `len:<bucket>+role:<role>+latency:<class>`."""
    requests: Readable = 0
    """Candidate requests of this cell in the window."""
    verdict: Verdict
    """Pass, Fail, Inconclusive or Error."""
    metrics: list[MetricResult] = Field(default_factory=list)
    """This cell's metrics."""


class ShadowCell(Model):
    """How often the candidate answered one cell's mirrored requests like stable."""

    cell: str
    """The cell, as `len:<bucket>+role:<role>+latency:<class>`."""
    pairs: Readable = 0
    """Candidate pairs compared in the window (skipped ones aside)."""
    agreement: Readable | None = None
    """Percent of them that agreed."""
    noise_pairs: Readable = 0
    """Noise pairs compared: stable's answer against stable's second answer."""
    noise_floor: Readable | None = None
    """Percent of the noise pairs that disagreed (the release's, when the cell has fewer than 10)."""
    adjusted: Readable | None = None
    """Agreement after the noise floor: 100 - max(0, disagreement - noise floor)."""
    verdict: Verdict
    """Pass, Fail, or Inconclusive (fewer pairs than minPairs)."""


class ShadowResult(Model):
    """The shadow-agreement of the window: overall, and per cell."""

    pairs: Readable = 0
    """Candidate pairs compared in the window."""
    agreement: Readable | None = None
    """Percent of them that agreed."""
    noise_pairs: Readable = 0
    """Noise pairs (stable against itself) compared."""
    noise_floor: Readable | None = None
    """Percent of the noise pairs that disagreed."""
    adjusted: Readable | None = None
    """Agreement after the noise floor, in percent."""
    skipped: Readable = 0
    """Pairs skipped (too long, binary, stable's error)."""
    cells: list[ShadowCell] = Field(default_factory=list)
    """Each mirrored cell's agreement."""
    worst_cell: str | None = None
    """The cell that agreed least."""


class AnalysisResult(Model):
    """The last analysis of the release: the window's metrics and the verdict."""

    time: datetime
    """When the analysis ran (the end of its window)."""
    verdict: Verdict
    """Pass, Fail, Inconclusive or Error."""
    metrics: list[MetricResult] = Field(default_factory=list)
    """Each metric's value and verdict."""
    step: int | None = Field(default=None, ge=0)
    """The step this analysis judged, as an index (0 is step 1/n)."""
    requests: Readable | None = None
    """Candidate requests in the window."""
    message: str | None = None
    """Why the verdict, in a line."""
    cells: list[CellResult] = Field(default_factory=list)
    """Per-cell verdicts, with analysis.perCell."""
    shadow: ShadowResult | None = None
    """shadow-agreement: the pairs compared, agreement and noise floor, overall and per cell."""


#: Pods holding the adapter whose addresses ``status.adapter.addresses`` (and the table) carry.
ADAPTER_ADDRESSES_LIMIT = 256
#: Pods ``status.adapter.pods`` lists by name (the counts cover all of them).
ADAPTER_PODS_LIMIT = 32

#: Where a LoRA adapter is on one pod: Loaded (listed by the engine's /v1/models), Loading
#: (asked, not yet listed), Failed (the engine refused; retried later), Unloaded (taken off).
AdapterPodState = Literal["Loaded", "Loading", "Failed", "Unloaded"]


class AdapterPod(Model):
    """One stable pod and the adapter candidate on it."""

    name: str = Field(max_length=253)
    """The Pod."""
    address: str = Field(max_length=64)
    """The pod's IP address (status.podIP)."""
    state: AdapterPodState
    """Loaded (the engine's /v1/models lists it), Loading, Failed (the engine refused it; tried again later)
    or Unloaded."""
    reason: str | None = Field(default=None, max_length=1024)
    """Why it is not Loaded: the engine's answer, clipped."""


class AdapterRelease(Model):
    """A LoRA adapter candidate (spec.candidate.adapter) on stable's pods."""

    model_version: str = Field(max_length=253)
    """The adapter's ModelVersion."""
    served_name: str | None = Field(default=None, max_length=253)
    """The name the engines serve it under (the ModelVersion's status.adapter.servedName), which the routers
    put in the candidate's requests' 'model'."""
    digest: str | None = Field(default=None, max_length=128)
    """The digest of the adapter's content as verified."""
    path: str | None = Field(default=None, max_length=2048)
    """What the engines were told to load: the directory."""
    addresses: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=ADAPTER_ADDRESSES_LIMIT
    )
    """The addresses (status.podIP) of the ready pods that have it loaded, sorted: the routing table sends the
    candidate's share to these only."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """The pods' port behind stable's Service port (its targetPort), where the routers reach the pods holding
    it; default: the Service port."""
    loaded: int = Field(default=0, ge=0)
    """Stable's ready pods that have it loaded."""
    total: int = Field(default=0, ge=0)
    """Stable's ready pods."""
    withdrawn_at: datetime | None = None
    """When the adapter lost its traffic for good (rollback, abort, deletion): it is unloaded once the
    requests in flight then have drained."""
    pods: list[AdapterPod] = Field(
        default_factory=list,
        max_length=ADAPTER_PODS_LIMIT,
        description=f"The pods, by name (at most {ADAPTER_PODS_LIMIT}: those not Loaded first).",
    )


class ScalerStatus(Model):
    """What scales one backend's Deployment: tinct's HPA, or tinct's KEDA ScaledObject and the HPA
    KEDA keeps for it, with the bounds tinct set."""

    side: Literal["stable", "candidate"]
    """Which side's Deployment it scales."""
    hpa: str
    """The HorizontalPodAutoscaler scaling the side: tinct's, or the one KEDA keeps for the ScaledObject."""
    scaled_object: str | None = None
    """The KEDA ScaledObject tinct writes for the side (autoscaling.keda)."""
    query: str | None = Field(default=None, max_length=8192)
    """The PromQL the side scales on (autoscaling.keda): replicas = ceil(value / targetPerReplica)."""
    min_replicas: int
    """Fewest replicas tinct allows the side now."""
    max_replicas: int
    """Most replicas tinct allows the side now."""
    managed: bool = True
    """False when an HPA or ScaledObject tinct did not create targets the Deployment, or KEDA is not
    installed: tinct then leaves the side alone."""


class RoutingRef(Model):
    """The routing table this status calls for, which routers follow."""

    config_map: str
    """Name of the routing-table ConfigMap."""
    namespace: str | None = None
    """Namespace of the routing-table ConfigMap."""
    version: int = Field(ge=0)
    """Version of the table written for this status."""
    digest: str | None = None
    """Digest of the table's content (all but its version)."""
    models: list[str] = Field(default_factory=list, max_length=32)
    """The models the table serves."""
    since: float | None = None
    """When the release first routed (epoch seconds, finer than the second its ConfigMap's creation counts):
    its table's own claim on its models, kept across versions and when the table is written again."""
    confirmed_at: datetime | None = None
    """When every router was first seen serving this version; a step's analysis window starts there."""


ActionResult = Literal["Done", "Refused"]


class ActionRecord(Model):
    """What became of the last tinct.io/action request."""

    value: ActionValue
    """The request, as <verb>@a<attempt>-<nonce>."""
    result: ActionResult
    """Done, or Refused (message says why)."""
    message: str = Field(default="", max_length=1024)
    """What was done, or why not."""
    time: datetime | None = None
    """When it was handled."""


class HistoryEntry(Model):
    """A transition recorded in status and not yet written to ``release_events``."""

    seq: int = Field(ge=0)
    """The transition's number within the release; keys its row."""
    reason: str
    """What happened, e.g. StepAdvanced, RolledBack."""
    message: str = Field(default="", max_length=2000)
    """The transition in a line."""
    phase: GrayReleasePhase
    """The phase right after it."""
    step: int = Field(ge=0)
    """The step index right after it (0 is step 1/n)."""
    weights: dict[str, float] = Field(default_factory=dict)
    """Candidate weight in percent per cell right after it."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """The last analysis' values then."""
    time: datetime
    """When it happened."""


class GrayReleaseStatus(Model):
    """The GrayRelease as the operator decided and recorded it; written by the operator only,
    and sealed by it (a status it cannot verify is restored, never acted on)."""

    phase: GrayReleasePhase = "Pending"
    """Pending (waiting for what message names), Progressing (a step in force), Paused, Promoted (the
    candidate serves every cell), RolledBack (stable serves every cell) or Failed (needs a spec change)."""
    step: int = Field(default=0, ge=0)
    """Index of the step in force into each cell's weights: 0 is the first step; progress shows it as 1/n."""
    message: str | None = None
    """What the release is doing or waiting for, in a line (steps as 2/4)."""
    observed_generation: int | None = None
    """The metadata.generation this status was decided from."""
    weights: dict[str, float] = Field(default_factory=dict)
    """Candidate weight in percent per cell (len:<bucket>+role:<role>+latency:<class>) in force."""
    shadows: dict[str, float] = Field(default_factory=dict)
    """Shadow share in percent per cell in force: the share of the requests stable answers that routers mirror
    to the candidate (cells[].shadow)."""
    failed_analyses: int = Field(default=0, ge=0)
    """Failed analyses in this attempt; failureLimit of them roll back."""
    last_analysis: AnalysisResult | None = None
    routing: RoutingRef | None = None
    conditions: list[Condition] = Field(default_factory=list)
    """Ready (promoted), Progressing, Degraded, ModelVersionsReady, BackendsAvailable, AnalysisReady,
    RouteAvailable, CapacityReady, AnalysisPassing, StatusVerified, Bookkeeping, and the HPAs'; each reason
    has a section in docs/troubleshooting.md."""
    inconclusive_analyses: int = Field(default=0, ge=0)
    """Consecutive inconclusive analyses."""
    step_started_at: datetime | None = None
    """When the current step (or Promoted/RolledBack) began."""
    pause_reason: str | None = None
    """Why the operator paused the release; `tinct release resume` clears it."""
    acknowledged_action: ActionValue | None = None
    """The last tinct.io/action annotation value carried out."""
    transitions: int = Field(default=0, ge=0)
    """Transitions so far; keys the history rows."""
    autoscaling: list[ScalerStatus] = Field(default_factory=list)
    """The bounds tinct set on each side's HPA (with spec.autoscaling)."""
    released: str | None = None
    """The `stable -> candidate` ModelVersions this status is about; a spec naming others starts the release
    over."""
    target: str | None = None
    """Digest of what is released (both sides' Services, ports, Deployments, URLs, scheduler versions and
    ModelVersion digests); a change starts the release over."""
    attempt: int = Field(default=0, ge=0)
    """Counts the starts of this release (a retry or restart is a new one)."""
    last_action: ActionRecord | None = None
    seen_actions: list[ActionValue] = Field(default_factory=list, max_length=SEEN_ACTIONS)
    """tinct.io/action values already handled; seen again, they are refused."""
    blocked_since: datetime | None = None
    """Since when the release is held without progress (see progressDeadlineSeconds)."""
    next_step: int | None = Field(default=None, ge=0)
    """A step decided on whose weights wait for the candidate's available replicas; the number of steps stands
    for promotion."""
    stable_floor: int | None = Field(default=None, ge=0)
    """Stable's replicas when the release started; kept until promotion."""
    history: list[HistoryEntry] = Field(default_factory=list, max_length=HISTORY_LIMIT)
    """Transitions recorded here and not yet in the release_events table."""
    adapter: AdapterRelease | None = None
    """A LoRA adapter candidate: its served name, digest and on how many of stable's pods it is loaded."""
    progress: str | None = None
    """The step as shown: `2/4` is the second of four."""
    candidate_weight: float = Field(default=0, ge=0, le=100)
    """The largest candidate weight of any cell in force."""
    sequence: int = Field(default=0, ge=0)
    """Statuses the operator has written for this release; one older than the last it recorded is not acted
    on."""
    seal: str | None = Field(default=None, max_length=128)
    """The operator's seal over this status and the release's uid (HMAC-SHA256 with a key only the operator
    holds): a status that does not verify is not acted on but restored, and reported (StatusVerified=False,
    StatusTampered)."""
