"""One side of a GrayRelease: the scheduler behind a Service that stable or the candidate is."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from tinct.api.v1alpha1.autoscaling import LABEL_NAME
from tinct.api.v1alpha1.common import DNS_NAME, Model
from tinct.api.v1alpha1.rules import Rule, cel

__all__ = ["Backend", "Engine", "Name"]

#: A Kubernetes object name.
Name = Annotated[str, Field(pattern=DNS_NAME, min_length=1, max_length=253)]

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
            message="metricsSelector keys must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*, at most 128 characters)",
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
