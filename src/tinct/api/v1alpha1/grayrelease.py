"""GrayRelease: move traffic from a stable backend to a candidate, dye cell by dye cell."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field
from pydantic.alias_generators import to_snake

from tinct.api.v1alpha1.common import DNS_NAME, Condition, Model, Resource, defaulted
from tinct.api.v1alpha1.rules import Rule, cel, cel_format, cel_list, strictly_increasing

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
    """A prompt-length bucket: requests of up to maxTokens estimated tokens."""

    name: DyeValue = Field(description="The bucket's name, as cells match it, e.g. short.")
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Upper bound in estimated prompt tokens (inclusive); omit it on the last, "
        "catch-all bucket.",
    )


_BOUNDED = "self.buckets.filter(b, has(b.maxTokens))"


class PromptLength(Model):
    """Buckets of the request's estimated prompt length (characters of the messages or prompt
    divided by charsPerToken), from the shortest to the catch-all."""

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

    buckets: list[Bucket] = Field(
        min_length=1,
        max_length=16,
        description="1 to 16 buckets with strictly increasing maxTokens; the last has none and takes "
        "the rest.",
    )
    chars_per_token: float = Field(
        default=4.0,
        gt=0,
        le=64,
        description="Characters counted as one token when estimating a prompt's length (default 4).",
    )


_DEFAULT_LISTED = Rule(
    cel="self.default in self.values",
    holds=lambda s: s.default in s.values,
    message="default must be one of values",
)


class RoleDye(Model):
    """The caller's role, from a header a trusted gateway sets."""

    model_config = cel(_DEFAULT_LISTED)

    header: HeaderName = Field(
        default="X-User-Role",
        description="Header carrying the caller's role, set by a gateway (default X-User-Role); the "
        "router believes it only from peers it is told to trust (tinct router --trust-role-from).",
    )
    values: list[DyeValue] = Field(
        default_factory=lambda: ["user"],
        min_length=1,
        max_length=32,
        description="The roles cells may match (default [user]); any other value counts as the default.",
    )
    default: DyeValue = Field(
        default="user",
        description="Role of a request without the header, or from an untrusted peer (default user).",
    )


class LatencyDye(Model):
    """The request's latency class, from a header, or derived from stream: true."""

    model_config = cel(
        _DEFAULT_LISTED,
        Rule(
            cel="!has(self.streamClass) || self.streamClass in self.values",
            holds=lambda s: s.stream_class is None or s.stream_class in s.values,
            message="streamClass must be one of values",
        ),
    )

    header: HeaderName = Field(
        default="X-Latency-Class", description="Header carrying the latency class (default X-Latency-Class)."
    )
    values: list[DyeValue] = Field(
        default_factory=lambda: ["low", "high"],
        min_length=1,
        max_length=16,
        description="The classes cells may match (default [low, high]); any other value counts as the default.",
    )
    default: DyeValue = Field(
        default="low", description="Class of a request without the header (default low)."
    )
    stream_class: DyeValue | None = Field(
        default=None, description="Class given to requests with stream: true and no header."
    )


class StickyKey(Model):
    """What keeps a caller on one side: requests with the same key land on the same side."""

    header: HeaderName = Field(
        default="X-Session-Id",
        description="Header whose value is hashed with the release's name (default X-Session-Id); "
        "requests without it are assigned at random.",
    )


class Dye(Model):
    """How the router classifies each request into a dye tag: prompt-length bucket x caller
    role x latency class."""

    prompt_length: PromptLength = Field(description="Prompt-length buckets.")
    role: RoleDye = defaulted(RoleDye)
    latency: LatencyDye = defaulted(LatencyDye)
    sticky_key: StickyKey = defaulted(StickyKey)


class CellMatch(Model):
    """Which requests a cell takes; an omitted field or * matches anything, and the most
    specific matching cell wins."""

    prompt_length: DyeMatch | None = Field(
        default=None, description="A bucket name of dye.promptLength, or *."
    )
    role: DyeMatch | None = Field(default=None, description="One of dye.role.values, or *.")
    latency: DyeMatch | None = Field(default=None, description="One of dye.latency.values, or *.")


class Cell(Model):
    """A dye cell and its candidate weight at each step."""

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


def cell_key(match: CellMatch) -> str:
    """A cell's name in status and history: its dye tag with ``*`` for what it does not fix."""

    def v(x: str | None) -> str:
        return x if x else "*"

    return f"len:{v(match.prompt_length)}+role:{v(match.role)}+latency:{v(match.latency)}"


def _cel_dye(c: str, field: str) -> str:
    """CEL: the cell ``c``'s match of ``field``, ``*`` when omitted."""
    return f"(has({c}.match.{field}) ? {c}.match.{field} : '*')"


def _cel_same(a: str, b: str) -> str:
    """CEL: cells ``a`` and ``b`` match alike (an omitted field is ``*``)."""
    return " && ".join(f"{_cel_dye(a, f)} == {_cel_dye(b, f)}" for f in ("promptLength", "role", "latency"))


def _first_failing(pred: str) -> str:
    """CEL: the index of the first cell ``c`` for which ``pred`` is false."""
    return f"self.cells.map(c, {pred}).indexOf(false)"


def _first_cell(cells: list[Any], ok: Callable[[Any], bool]) -> int:
    return next(i for i, c in enumerate(cells) if not ok(c))


def _dye_rule(
    field: str, allowed: Callable[[Any], list[str]], allowed_cel: str, what: str, pred: str | None = None
) -> Rule:
    """A cell's ``match.<field>`` must be one of the dye's values (``*`` and omitted match any)."""
    attr = to_snake(field)
    pred = pred or f"!has(c.match.{field}) || c.match.{field} == '*' || c.match.{field} in {allowed_cel}"

    def ok(s: Any) -> Callable[[Any], bool]:
        return lambda c: _wild(getattr(c.match, attr)) or getattr(c.match, attr) in allowed(s)

    def describe(s: Any) -> str:
        i = _first_cell(s.cells, ok(s))
        value = getattr(s.cells[i].match, attr)
        return f'cells[{i}].match.{field} "{value}" is not {what} {cel_list(allowed(s))}'

    index = _first_failing(pred)
    return Rule(
        cel=f"self.cells.all(c, {pred})",
        holds=lambda s: all(ok(s)(c) for c in s.cells),
        message=f"a cell's match.{field} must be {what}",
        field_path=".cells",
        message_expression=cel_format(
            f'cells[%d].match.{field} "%s" is not {what} %s',
            index,
            f"self.cells[{index}].match.{field}",
            allowed_cel,
        ),
        describe=describe,
    )


def _same_match(s: Any) -> int | None:
    """The last cell whose match an earlier cell has too."""
    keys = [cell_key(c.match) for c in s.cells]
    return next((i for i in range(len(keys) - 1, -1, -1) if keys.count(keys[i]) > 1), None)


def _describe_same_match(s: Any) -> str:
    i = _same_match(s)
    assert i is not None
    return (
        f"cells[{i}] has the same match as an earlier cell ({cell_key(s.cells[i].match)}): "
        "the router would follow one of them only; give each cell its own match"
    )


_UNIQUE_MATCH = f"self.cells.exists_one(o, {_cel_same('o', 'c')})"
_LAST_REPEATED = f"self.cells.map(c, {_UNIQUE_MATCH}).lastIndexOf(false)"

#: Rules over ``dye`` and ``cells[].match`` only, shared by GrayReleaseSpec and the routing table.
CELL_RULES = (
    Rule(
        cel=f"self.cells.filter(c, {_IS_DEFAULT_CELL}).size() == 1",
        holds=lambda s: sum(_is_default(c.match) for c in s.cells) == 1,
        message="exactly one default cell (match: {}) is required",
        field_path=".cells",
    ),
    Rule(
        cel=f"self.cells.all(c, {_UNIQUE_MATCH})",
        holds=lambda s: _same_match(s) is None,
        message="each cell needs its own match",
        field_path=".cells",
        # The last repeated cell. (Naming the cell it repeats too costs more than the API server
        # allows a message; cel.bind would name the index once, but a variable it binds is not
        # seen inside has() nor after a nested map.)
        message_expression=cel_format(
            "cells[%d] has the same match as an earlier cell (len:%s+role:%s+latency:%s): the router "
            "would follow one of them only; give each cell its own match",
            _LAST_REPEATED,
            *(
                f"self.cells.map(c, {_cel_dye('c', f)})[{_LAST_REPEATED}]"
                for f in ("promptLength", "role", "latency")
            ),
        ),
        describe=_describe_same_match,
    ),
    _dye_rule(
        "promptLength",
        lambda s: [b.name for b in s.dye.prompt_length.buckets],
        "self.dye.promptLength.buckets.map(b, b.name)",
        "a bucket of dye.promptLength",
        pred="!has(c.match.promptLength) || c.match.promptLength == '*' || "
        "self.dye.promptLength.buckets.exists(b, b.name == c.match.promptLength)",
    ),
    _dye_rule("role", lambda s: list(s.dye.role.values), "self.dye.role.values", "one of dye.role.values"),
    _dye_rule(
        "latency",
        lambda s: list(s.dye.latency.values),
        "self.dye.latency.values",
        "one of dye.latency.values",
    ),
)


class PrometheusRef(Model):
    """Which Prometheus the analysis reads: one the operator is configured with (tinct operator
    --prometheus-url and --prometheus, the chart's operator.prometheus). Name one, or give
    neither field for the operator's default; any other URL is refused."""

    # The operator queries only URLs from its own configuration, so creating a GrayRelease
    # never makes it fetch an address of the creator's choosing.

    model_config = cel(
        Rule(
            cel="!(has(self.name) && has(self.url))",
            holds=lambda s: s.name is None or s.url is None,
            message="give prometheus.name or prometheus.url, not both",
        )
    )

    name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="Name of a Prometheus in the operator's configuration (tinct operator "
        "--prometheus NAME=URL).",
    )
    url: str | None = Field(
        default=None,
        pattern=r"^https?://.+",
        max_length=2048,
        description="URL of a Prometheus; must be one the operator is configured with "
        "(its default or one of its named ones), else the release is refused.",
    )


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
    )

    name: Literal["success-rate", "latency-p95", "custom"] = Field(
        description="success-rate (percent of the candidate's requests answered whole and without a "
        "5xx) and latency-p95 (milliseconds to the first byte) come from the routers' metrics of "
        "this release; custom runs query."
    )
    min: float | None = Field(
        default=None, description="Fail when the value is below (success-rate: percent, e.g. 99)."
    )
    max: float | None = Field(default=None, description="Fail when the value is above.")
    max_ms: float | None = Field(
        default=None, gt=0, description="latency-p95: fail above this many milliseconds."
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
        description="success-rate / latency-p95: also fail when the candidate is worse than stable over "
        "the same window by more than this (percentage points / milliseconds).",
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
        description="Judge success-rate and latency-p95 per dye cell: every cell with minRequests must "
        "pass (default false).",
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


class ScaleMetric(Model):
    """The per-Pod metric each side's HorizontalPodAutoscaler scales on."""

    pods: str = Field(
        default="http_requests_total",
        max_length=253,
        description="Name of a Pods metric from the custom metrics API (default http_requests_total).",
    )
    average_value: str = Field(
        default="250",
        pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G)?$",
        max_length=32,
        description="Target average value per Pod, a Kubernetes quantity such as 250 or 1500m (default 250).",
    )


class Autoscaling(Model):
    """A HorizontalPodAutoscaler tinct manages for each side's Deployment: the candidate's
    minimum follows its share of the traffic, stable keeps its floor until promotion."""

    model_config = cel(
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            holds=lambda s: s.min_replicas <= s.max_replicas,
            message="minReplicas must be <= maxReplicas",
        )
    )

    min_replicas: int = Field(
        default=1, ge=1, le=10000, description="Fewest replicas of each side (default 1)."
    )
    max_replicas: int = Field(
        default=10, ge=1, le=10000, description="Most replicas of each side (default 10)."
    )
    metric: ScaleMetric = defaulted(ScaleMetric)


def _describe_uneven(s: Any) -> str:
    n = len(s.cells[0].weights)
    i = _first_cell(s.cells, lambda c: len(c.weights) == n)
    return (
        f"cells[{i}] has {len(s.cells[i].weights)} weights but cells[0] has {n}: "
        "give every cell one weight per step"
    )


_EVEN = "size(c.weights) == size(self.cells[0].weights)"
_UNEVEN = _first_failing(_EVEN)


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
        description="HorizontalPodAutoscalers tinct manages for both Deployments; omitted: none, scale "
        "the candidate yourself (CapacityReady says how many replicas a step needs).",
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


Verdict = Literal["Pass", "Fail", "Error", "Inconclusive"]

#: Significant digits a measured number keeps in status: 99.8421, not 99.84210526315789.
READABLE_DIGITS = 6


def readable(value: float | None) -> float | None:
    """``value`` rounded to :data:`READABLE_DIGITS` significant digits (NaN and inf kept)."""
    if value is None or not math.isfinite(value):
        return value
    return float(f"{value:.{READABLE_DIGITS}g}")


Readable = Annotated[float, AfterValidator(lambda v: readable(v))]


class MetricResult(Model):
    """One metric of one analysis: its value, the threshold, the verdict."""

    name: str = Field(description="The metric: success-rate, latency-p95 or custom.")
    value: Readable | None = Field(
        default=None,
        description="The candidate's value over the window (percent for success-rate, ms for "
        "latency-p95); absent when there was no data.",
    )
    threshold: str = Field(description="What the value was held to, e.g. `>= 99`.")
    verdict: Verdict = Field(description="Pass, Fail, Inconclusive (too little data) or Error.")
    message: str | None = Field(default=None, description="Why the verdict, when it is not Pass.")
    stable_value: Readable | None = Field(default=None, description="The same metric of stable, if compared.")


class CellResult(Model):
    """Verdict of one dye cell when the analysis is per cell."""

    cell: str = Field(description="The cell, as `len:<bucket>+role:<role>+latency:<class>`.")
    requests: Readable = Field(default=0, description="Candidate requests of this cell in the window.")
    verdict: Verdict = Field(description="Pass, Fail, Inconclusive or Error.")
    metrics: list[MetricResult] = Field(default_factory=list, description="This cell's metrics.")


class AnalysisResult(Model):
    """The last analysis of the release: the window's metrics and the verdict."""

    time: datetime = Field(description="When the analysis ran (the end of its window).")
    verdict: Verdict = Field(description="Pass, Fail, Inconclusive or Error.")
    metrics: list[MetricResult] = Field(default_factory=list, description="Each metric's value and verdict.")
    step: int | None = Field(
        default=None, ge=0, description="The step this analysis judged, as an index (0 is step 1/n)."
    )
    requests: Readable | None = Field(default=None, description="Candidate requests in the window.")
    message: str | None = Field(default=None, description="Why the verdict, in a line.")
    cells: list[CellResult] = Field(
        default_factory=list, description="Per-cell verdicts, with analysis.perCell."
    )


class ScalerStatus(Model):
    """The bounds tinct set on one backend's HorizontalPodAutoscaler."""

    side: Literal["stable", "candidate"] = Field(description="Which side's Deployment it scales.")
    hpa: str = Field(description="Name of the HorizontalPodAutoscaler.")
    min_replicas: int = Field(description="The minimum tinct set (raised for the step's share).")
    max_replicas: int = Field(description="The maximum tinct set.")
    managed: bool = Field(default=True, description="False when another HPA targets the Deployment.")


class RoutingRef(Model):
    """The routing table this status calls for, which routers follow."""

    config_map: str = Field(description="Name of the routing-table ConfigMap.")
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

    value: str = Field(max_length=256, description="The request, as <verb>@a<attempt>-<nonce>.")
    result: ActionResult = Field(description="Done, or Refused (message says why).")
    message: str = Field(default="", max_length=1024, description="What was done, or why not.")
    time: datetime | None = Field(default=None, description="When it was handled.")


class HistoryEntry(Model):
    """A transition recorded in status and not yet written to ``release_events``."""

    seq: int = Field(ge=0, description="The transition's number within the release; keys its row.")
    reason: str = Field(description="What happened, e.g. StepAdvanced, RolledBack.")
    message: str = Field(default="", max_length=2000, description="The transition in a line.")
    phase: GrayReleasePhase = Field(description="The phase right after it.")
    step: int = Field(ge=0, description="The step index right after it (0 is step 1/n).")
    weights: dict[str, float] = Field(
        default_factory=dict, description="Candidate weight in percent per cell right after it."
    )
    metrics: dict[str, float] = Field(default_factory=dict, description="The last analysis' values then.")
    time: datetime = Field(description="When it happened.")


class GrayReleaseStatus(Model):
    """The GrayRelease as the operator decided and recorded it; written by the operator only."""

    phase: GrayReleasePhase = Field(
        default="Pending",
        description="Pending (waiting for what message names), Progressing (a step in force), Paused, "
        "Promoted (the candidate serves every cell), RolledBack (stable serves every cell) or Failed "
        "(needs a spec change).",
    )
    step: int = Field(
        default=0,
        ge=0,
        description="Index of the step in force into each cell's weights: 0 is the first step; "
        "progress shows it as 1/n.",
    )
    message: str | None = Field(
        default=None, description="What the release is doing or waiting for, in a line (steps as 2/4)."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status was decided from."
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Candidate weight in percent per cell (len:<bucket>+role:<role>+latency:<class>) "
        "in force.",
    )
    failed_analyses: int = Field(
        default=0, ge=0, description="Failed analyses in this attempt; failureLimit of them roll back."
    )
    last_analysis: AnalysisResult | None = None
    routing: RoutingRef | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready (promoted), Progressing, Degraded, ModelVersionsReady, BackendsAvailable, "
        "AnalysisReady, RouteAvailable, CapacityReady, AnalysisPassing, and the HPAs'; each reason has "
        "a section in docs/troubleshooting.md.",
    )
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
    autoscaling: list[ScalerStatus] = Field(
        default_factory=list, description="The bounds tinct set on each side's HPA (with spec.autoscaling)."
    )
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
