"""GrayRelease builders shared by the release tests: the shipped example, a round of the
decision as the controller records it, ModelVersion bodies."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from tinct.api.v1alpha1.grayrelease import AnalysisResult, GrayRelease, MetricResult
from tinct.operator.grayrelease.decide import decide
from tinct.operator.grayrelease.decision import Capacity, Decision, Inputs
from tinct.operator.grayrelease.preconditions import Problem
from tinct.operator.grayrelease.tables import plan
from tinct.operator.grayrelease.timing import needs_confirmation
from tinct_testing.paths import EXAMPLES

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LONG = "len:long+role:admin+latency:high"
SHORT = "len:short+role:user+latency:low"
DEFAULT = "len:*+role:*+latency:*"
TABLES = "tinct-system"


#: The HPA form of ``spec.autoscaling`` the release tests exercise; the example itself scales
#: through KEDA, which the tests of ``autoscaling.keda`` ask for on purpose.
HPA_AUTOSCALING: dict[str, Any] = {
    "minReplicas": 1,
    "maxReplicas": 12,
    "metric": {"pods": "http_requests_total", "averageValue": "250"},
}


def example(**spec: Any) -> dict[str, Any]:
    """``examples/grayrelease.yaml`` with ``spec`` fields replaced; autoscaling by HPA unless given."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text())
    doc["spec"]["autoscaling"] = copy.deepcopy(HPA_AUTOSCALING)
    doc["spec"].update(copy.deepcopy(spec))  # a shared constant stays as it was
    return doc


def release(**spec: Any) -> GrayRelease:
    """:func:`example` in namespace llm, as the controller reads it."""
    doc = example(**spec)
    doc["metadata"].update(namespace="llm", uid="uid-1", generation=1)
    return GrayRelease.model_validate(doc)


def mv(
    model: str = "llama3-8b", version: str = "1.4.0", phase: str | None = "Ready", digest: str = "d1"
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "digests": {"onnx": digest}} if phase else {}
    return {"spec": {"model": model, "version": version}, "status": status}


def ok_objects(gr: GrayRelease) -> tuple[dict[str, Any], dict[str, bool], dict[str, bool]]:
    s = gr.spec
    mvs = {s.stable.model_version: mv(version="1.4.0"), s.candidate.model_version: mv(version="1.5.0")}
    return mvs, {"sched-v1": True, "sched-v2": True}, {"sched-v1": True, "sched-v2": True}


def result(verdict: str, at: datetime) -> AnalysisResult:
    return AnalysisResult(
        time=at,
        verdict=verdict,
        metrics=[MetricResult(name="success-rate", value=99.5, threshold=">= 99", verdict=verdict)],
    )


def round_(
    gr: GrayRelease,
    now: datetime,
    analysis: AnalysisResult | None = None,
    *,
    problems: Sequence[Problem] = (),
    actions: Sequence[str] = (),
    capacity: Capacity | None = None,
    target: str | None = None,
    routers: int | None = None,
    conflict: str | None = None,
) -> Decision:
    """One decision with its table planned into the status, as the controller records it."""
    d = decide(
        gr,
        Inputs(
            now=now,
            problems=problems,
            analysis=analysis,
            actions=actions,
            capacity=capacity or Capacity(),
            target=target,
            routers=routers,
            conflict=conflict,
        ),
    )
    plan(gr, d.status, table_namespace=TABLES, models=["llama3-8b"])
    return d


def step(gr: GrayRelease, now: datetime, analysis: AnalysisResult | None = None, **kw: Any) -> GrayRelease:
    """:func:`round_` applied to ``gr``; routers that serve every table at once confirm it
    in a round of their own (pass ``confirm=False`` to leave the step unconfirmed)."""
    confirm = kw.pop("confirm", True)
    d = round_(gr, now, analysis, **kw)
    out = gr.model_copy(update={"status": d.status})
    if confirm and needs_confirmation(out):
        assert out.status is not None
        assert out.status.routing is not None
        kw.pop("actions", None)
        d = round_(out, now, routers=out.status.routing.version, **kw)
        out = out.model_copy(update={"status": d.status})
    return out
