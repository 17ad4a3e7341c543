"""GrayRelease builders shared by the release tests: the shipped example, a step of the
state machine, ModelVersion bodies."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import yaml

from conftest import EXAMPLES
from tinct.api.v1alpha1.grayrelease import AnalysisResult, GrayRelease, MetricResult
from tinct.operator.release.decide import decide

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LONG = "len:long+role:admin+latency:high"
SHORT = "len:short+role:user+latency:low"
DEFAULT = "len:*+role:*+latency:*"


def release(**spec: Any) -> GrayRelease:
    doc = yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text())
    doc["metadata"].update(namespace="llm", uid="uid-1", generation=1)
    doc["spec"].update(spec)
    return GrayRelease.model_validate(doc)


def mv(model: str = "llama3-8b", version: str = "1.4.0", phase: str | None = "Ready") -> dict[str, Any]:
    return {"spec": {"model": model, "version": version}, "status": {"phase": phase} if phase else {}}


def ok_objects(gr: GrayRelease) -> tuple[dict[str, Any], dict[str, bool], dict[str, bool]]:
    s = gr.spec
    mvs = {s.stable.model_version: mv(version="1.4.0"), s.candidate.model_version: mv(version="1.5.0")}
    return mvs, {"sched-v1": True, "sched-v2": True}, {"sched-v1": True, "sched-v2": True}


def result(verdict: str, at: datetime) -> AnalysisResult:
    return AnalysisResult(
        time=at,
        verdict=verdict,  # type: ignore[arg-type]
        metrics=[MetricResult(name="success-rate", value=99.5, threshold=">= 99", verdict=verdict)],  # type: ignore[arg-type]
    )


def step(gr: GrayRelease, now: datetime, analysis: AnalysisResult | None = None, **kw: Any) -> GrayRelease:
    """One decision applied to ``gr``, as the controller records it in status."""
    d = decide(gr, problems=kw.pop("problems", []), analysis=analysis, action=kw.pop("action", None), now=now)
    return gr.model_copy(update={"status": d.status})
