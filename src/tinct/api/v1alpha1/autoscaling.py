"""``spec.autoscaling`` of a GrayRelease: how each side's Deployment is scaled during a release.

Two ways, one per release:

- a ``autoscaling/v2`` HorizontalPodAutoscaler per side on :class:`ScaleMetric` (a pods
  metric, or CPU / memory as a resource metric), and
- with :class:`Keda`, a KEDA ``ScaledObject`` per side on a Prometheus query (KEDA's
  ``prometheus`` scaler): by default the queue depth of the side's serving engine, read
  from that side's own series, never from both sides together.

Either way tinct sets the bounds (``minReplicas``/``maxReplicas``) from the release's
recorded state; see :mod:`tinct.operator.grayrelease.scaling`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from tinct.api.v1alpha1.common import Model, defaulted
from tinct.api.v1alpha1.prometheus import PrometheusRef
from tinct.api.v1alpha1.rules import Rule, cel

__all__ = ["LABEL_NAME", "Autoscaling", "Keda", "KedaSide", "ScaleMetric"]

#: A Kubernetes quantity as an HPA target takes it: ``250``, ``0.5``, ``500m``, ``2k``.
Quantity = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G)?$", max_length=32)]
#: A Prometheus label name.
#: A Prometheus label name, of at most 128 characters (the bound keeps a release's size bounded).
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]{0,127}$"
_LABEL_NAME = re.compile(LABEL_NAME)
LabelValue = Annotated[str, Field(max_length=256)]


class ScaleMetric(Model):
    """The HPA's metric, used when keda is not set."""

    pods: str = Field(default="http_requests_total", max_length=253)
    """A pods metric (from a custom-metrics adapter) each replica is held to averageValue of; cpu or memory
    name a resource metric instead (default http_requests_total)."""
    average_value: Quantity = "250"
    """Target per replica, as a Kubernetes quantity in the metric's unit (for cpu, cores: 500m is half a core;
    for memory, bytes: 2G); default 250."""


class KedaSide(Model):
    """What one side scales on: its engine's queue, selected by its own labels, or its own query."""

    model_config = cel(
        Rule(
            cel=f"!has(self.labels) || self.labels.all(k, k.matches('{LABEL_NAME}'))",
            holds=lambda s: s.labels is None or all(_LABEL_NAME.match(k) for k in s.labels),
            message="labels must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*, at most 128 characters)",
            field_path=".labels",
        ),
        Rule(
            cel="!(has(self.labels) && has(self.query))",
            holds=lambda s: s.labels is None or s.query is None,
            message="give labels or query, not both: labels select the series of the engine's default query",
        ),
    )

    labels: dict[str, LabelValue] | None = Field(default=None, min_length=1, max_length=16)
    """Prometheus labels and the exact values that select this side's engine series for the default query;
    default: namespace (the release's) and service (this side's Service)."""
    query: str | None = Field(default=None, min_length=1, max_length=4096)
    """PromQL returning one number, the load of this side alone, instead of its engine's queue depth (e.g.
    sum(rate(...{service="sched-v2"}[1m]))); replicas = ceil(value / targetPerReplica)."""


class Keda(Model):
    """Scale each side through a KEDA ScaledObject on a Prometheus query (KEDA's prometheus scaler).

    KEDA must be installed in the cluster; tinct writes one ScaledObject per Deployment and
    KEDA keeps an HPA for it on the external metric.
    """

    model_config = cel(
        Rule(
            cel="!has(self.stable.labels) || !has(self.candidate.labels) || "
            "self.stable.labels != self.candidate.labels",
            holds=lambda s: s.stable.labels is None or s.stable.labels != s.candidate.labels,
            message="stable and candidate need different labels: each side scales on its own series",
        ),
        Rule(
            cel="!has(self.stable.query) || !has(self.candidate.query) || self.stable.query != self.candidate.query",
            holds=lambda s: s.stable.query is None or s.stable.query != s.candidate.query,
            message="stable and candidate need different queries: each side scales on its own signal",
        ),
    )

    prometheus: PrometheusRef = Field(default_factory=PrometheusRef, json_schema_extra={"default": {}})
    """The Prometheus KEDA queries: one the operator is configured with, as for analysis (its default if
    neither name nor url is given)."""
    target_per_replica: float = Field(default=5, gt=0, le=1e9)
    """What one replica should carry, in the query's unit (for the engines' default query: requests waiting in
    the engine's queue). A side gets ceil(value / targetPerReplica) replicas, within the bounds tinct sets."""
    stable: KedaSide = defaulted(KedaSide)
    candidate: KedaSide = defaulted(KedaSide)
    scale_up_stabilization_seconds: int = Field(default=0, ge=0, le=3600)
    """Seconds over which a scale-up takes the lowest recommendation (default 0: at once)."""
    scale_down_stabilization_seconds: int = Field(default=300, ge=0, le=3600)
    """Seconds over which a scale-down takes the highest recommendation, so a queue that empties for a moment
    does not take replicas away (default 300)."""


class Autoscaling(Model):
    model_config = cel(
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            holds=lambda s: s.min_replicas <= s.max_replicas,
            message="minReplicas must be <= maxReplicas",
        )
    )

    min_replicas: int = Field(default=1, ge=1, le=10000)
    """Fewest replicas of a side at rest, in replicas (default 1)."""
    max_replicas: int = Field(default=10, ge=1, le=10000)
    """Most replicas of a side serving all traffic, in replicas (default 10); the candidate's maximum follows
    its largest cell weight."""
    metric: ScaleMetric = defaulted(ScaleMetric)
    keda: Keda | None = None
    """Scale through KEDA ScaledObjects on a Prometheus query instead of HPAs on metric (which is then not
    used)."""
