"""One side of a GrayRelease: the scheduler behind a Service that stable or the candidate is."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, JsonValue, SerializerFunctionWrapHandler, model_serializer
from pydantic.json_schema import SkipJsonSchema

from tinct.api.v1alpha1.autoscaling import LABEL_NAME
from tinct.api.v1alpha1.common import DNS_NAME, Model
from tinct.api.v1alpha1.rules import Rule, Rules, cel

__all__ = ["SHARED_FIELDS", "AdapterCandidate", "Backend", "Candidate", "Engine", "Name"]

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

    model_version: Name
    """Name of the ModelVersion served by this backend."""
    service: Name
    """Service the router sends this side's traffic to."""
    port: int = Field(ge=1, le=65535)
    """Service port."""
    deployment: Name | None = None
    """Deployment scaled by the HPA tinct manages; none if omitted."""
    scheduler_version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=63)
    """Sent as X-Scheduler-Version; a backend answering 426 rejects it."""
    url: str | None = Field(
        default=None, pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?$", max_length=512
    )
    """Base URL routers use instead of the Service's cluster DNS name, e.g. for a backend outside the cluster;
    the Service must still exist."""
    engine: Engine | None = None
    """The serving engine behind this side, whose own /metrics Prometheus scrapes: the engine metrics of the
    analysis and KEDA scaling (autoscaling.keda) read its series under its names: vllm
    (vllm:num_requests_waiting, vllm:kv_cache_usage_perc or before 0.9 vllm:gpu_cache_usage_perc,
    vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total or vllm:gpu_prefix_cache_*), sglang
    (sglang:num_queue_reqs, sglang:token_usage, sglang:cached_tokens_total / sglang:prompt_tokens_total or
    sglang:cache_hit_rate; or their sglang_ forms), tgi (tgi_queue_size; no KV-cache or prefix-cache
    metric). None: no engine metrics."""
    metrics_selector: dict[str, Annotated[str, Field(max_length=256)]] | None = Field(
        default=None, min_length=1, max_length=8
    )
    """Prometheus labels, exact values, that select this side's engine series and no other's for the analysis'
    engine metrics (queue-depth, kv-cache-usage, prefix-cache-hit-rate; on stable, for their
    maxStableDelta). Default: namespace (the release's) and service (this side's Service), as
    autoscaling.keda's labels."""


class AdapterCandidate(Model):
    """A LoRA adapter served as the candidate on stable's own pods, loaded at runtime."""

    model_version: Name
    """Name of the adapter's ModelVersion (spec.adapter.baseModelVersion naming stable's ModelVersion); it is
    loaded into every stable pod through the engine's API (stable.engine: vllm or sglang) under its served
    name."""
    uri_prefix: str | None = Field(default=None, min_length=1, max_length=1024)
    """Start of the adapter's artifact URIs that mountPath stands for on the engine pods, e.g.
    s3://models/adapters/; default: the engines load the adapter's directory URI as it is."""
    mount_path: str | None = Field(default=None, pattern=r"^/[^\s]*$", max_length=1024)
    """Where the engine pods mount uriPrefix, e.g. /adapters: the engines load mountPath + the rest of the
    adapter's directory URI."""


#: Candidate fields an adapter candidate takes from stable (the same Service, port and pods).
SHARED_FIELDS = ("service", "port", "scheduler_version", "engine", "url", "metrics_selector")
_OWN = ("service", "port", "scheduler_version", "model_version")


class _CandidateRules(Rules):
    """The candidate's rules; an adapter candidate names no Service of its own, so the fields a
    plain candidate needs are optional on the wire (:class:`Candidate`'s rule requires them)."""

    def __call__(self, schema: dict[str, JsonValue]) -> None:
        super().__call__(schema)
        required = schema.get("required")
        if isinstance(required, list):
            kept = [f for f in required if f not in ("service", "port", "schedulerVersion", "modelVersion")]
            if kept:
                schema["required"] = kept
            else:
                del schema["required"]


_ADAPTER_EXCLUSIVE = (
    "has(self.adapter) ? !has(self.service) && !has(self.port) && !has(self.deployment) && "
    "!has(self.modelVersion) && !has(self.schedulerVersion) && !has(self.url) && !has(self.engine) : "
    "has(self.service) && has(self.port) && has(self.modelVersion) && has(self.schedulerVersion)"
)


class Candidate(Backend):
    """The candidate side: a backend of its own, or a LoRA adapter on stable's pods (adapter)."""

    model_config = ConfigDict(
        json_schema_extra=_CandidateRules(
            (
                *Backend.model_config["json_schema_extra"].rules,  # type: ignore[union-attr]
                Rule(
                    cel=_ADAPTER_EXCLUSIVE,
                    holds=lambda s: (
                        s.shares_stable and s.deployment is None
                        if s.adapter is not None
                        else not s.shares_stable
                    ),
                    message="give candidate.adapter (a LoRA adapter on stable's pods) or candidate's "
                    "own service, port, modelVersion and schedulerVersion, not both: an adapter "
                    "candidate shares stable's Service, pods and engine",
                ),
            )
        )
    )

    adapter: AdapterCandidate | None = None
    """Release a LoRA adapter instead of another backend: the candidate shares stable's Service, pods and
    engine; tinct loads the adapter into every stable pod and routes the candidate's share, with 'model'
    rewritten to the adapter's served name, to the pods that have it. Excludes service, port, deployment,
    modelVersion, schedulerVersion, url and engine here."""
    shares_stable: SkipJsonSchema[bool] = Field(default=False, exclude=True)

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        """An adapter candidate as written: without the fields it takes from stable."""
        data = handler(self)
        if self.shares_stable and isinstance(data, dict):
            for name in (*SHARED_FIELDS, "model_version"):
                data.pop(name, None)
                data.pop(_camel(name), None)
        return data


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def share_stable(spec: Any) -> Any:
    """A GrayRelease spec as given, its adapter candidate completed from stable: the same
    Service, port, scheduler version, engine, URL and metrics selector, and the adapter's
    ModelVersion."""
    if not isinstance(spec, dict):
        return spec
    candidate, stable = spec.get("candidate"), spec.get("stable")
    if not isinstance(candidate, dict) or not isinstance(stable, dict):
        return spec
    adapter = candidate.get("adapter")
    given = {k for k in candidate if k != "adapter"}
    own = {n for name in (*_OWN, *SHARED_FIELDS, "deployment") for n in (name, _camel(name))}
    plain = {k: v for k, v in candidate.items() if k not in ("sharesStable", "shares_stable")}
    if not isinstance(adapter, dict):
        return {**spec, "candidate": plain}
    # Fields given beside the adapter stay as given, and the candidate's rule refuses them.
    taken = {_camel(f): stable[key] for f in SHARED_FIELDS for key in (f, _camel(f)) if key in stable}
    version = adapter.get("modelVersion", adapter.get("model_version"))
    filled = {**taken, "modelVersion": version, **plain, "sharesStable": not (given & own)}
    return {**spec, "candidate": filled}
