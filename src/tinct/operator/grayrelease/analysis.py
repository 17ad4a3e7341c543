"""Analysis of a release's candidate: one window read from Prometheus, then judged.

The built-ins read from the routers (not at a dark step, where the candidate has no live
traffic) (:mod:`tinct.operator.grayrelease.samples`: a few PromQL
queries per analysis, only those the release's metrics need, selected by the release's
namespace and name, over the last interval, grouped by side and dye tag); the engine
metrics (:mod:`tinct.operator.grayrelease.engine`) read each side's own engine through the
labels its ``metricsSelector`` names: one query per metric and side; custom metrics run
their PromQL as written, with ``$namespace``, ``$release`` and ``$interval`` replaced, and
must return one number; ``shadow-agreement`` reads the comparer's pairs
(:mod:`tinct.operator.grayrelease.agreement`).

:func:`analyse` is a coroutine that queries Prometheus through the bounded client of
:mod:`tinct.operator.grayrelease.prometheus` (deadlines, a cap on the body, no answer quoted
in a message) and hands the answers to :func:`~tinct.operator.grayrelease.verdict.evaluate`,
which says what counts. Prometheus unreachable or answering an error makes the verdict
``Inconclusive``, never ``Fail``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import aiohttp

from tinct.api.v1alpha1.analysis import ENGINE_METRICS, SHADOW_METRIC
from tinct.api.v1alpha1.grayrelease import Analysis, AnalysisResult, Backend
from tinct.operator.grayrelease import agreement
from tinct.operator.grayrelease.engine import Reading, engine_query, no_metric, reading_from
from tinct.operator.grayrelease.prometheus import PrometheusError, PrometheusTarget, querying
from tinct.operator.grayrelease.samples import prom_number, queries, samples_from, value_of
from tinct.operator.grayrelease.verdict import evaluate, inconclusive

__all__ = ["analyse", "custom_query"]


def _custom_value(rows: list[dict[str, Any]]) -> float | str:
    if not rows:
        return "the query returned no data"
    if len(rows) > 1:
        return f"the query returned {len(rows)} series; aggregate it to one number (e.g. sum(...))"
    v = value_of(rows[0])
    if not math.isfinite(v):
        return f"the query returned {prom_number(v)}, not a finite number"
    return v


def custom_query(query: str, namespace: str, release: str, window: str) -> str:
    """A custom metric's PromQL with ``$namespace``, ``$release`` and ``$interval`` replaced."""
    return query.replace("$namespace", namespace).replace("$release", release).replace("$interval", window)


async def _engine_readings(
    query: Any, spec: Analysis, sides: Mapping[str, Backend], namespace: str, window: str
) -> dict[int, tuple[Reading, Reading | None]]:
    """Each engine metric of ``spec``: the candidate's reading, and stable's when compared.
    A side's series are those its ``metricsSelector`` selects, by default the release's
    ``namespace`` and the side's ``service`` (as KEDA scaling selects them)."""
    out: dict[int, tuple[Reading, Reading | None]] = {}

    async def read(metric: str, backend: Backend | None, i: int) -> Reading | None:
        if backend is None or backend.engine is None:
            return None
        labels = backend.metrics_selector or {"namespace": namespace, "service": backend.service}
        promql = engine_query(metric, backend.engine, labels, window)
        if promql is None:
            return Reading(why=no_metric(metric, backend.engine))
        try:
            rows = await query(promql)
        except PrometheusError as exc:
            raise PrometheusError(exc.target, f"{exc.problem} (the query of metrics[{i}])") from None
        return reading_from(metric, backend.engine, labels, rows)

    for i, m in enumerate(spec.metrics):
        if m.name not in ENGINE_METRICS:
            continue
        cand = await read(m.name, sides.get("candidate"), i)
        if cand is None:
            cand = Reading(why="spec.candidate names no engine")
        stable = await read(m.name, sides.get("stable"), i) if m.max_stable_delta is not None else None
        out[i] = (cand, stable)
    return out


async def analyse(
    spec: Analysis,
    namespace: str,
    release: str,
    now: datetime,
    *,
    prometheus: PrometheusTarget,
    cells: Mapping[str, list[str]] | None = None,
    cutoff_ms: float | None = None,
    sides: Mapping[str, Backend] | None = None,
    session: aiohttp.ClientSession | None = None,
    live: bool = True,
    shadowed: Collection[str] = (),
) -> AnalysisResult:
    """Query Prometheus for the ``spec.interval`` up to ``now`` of the release and judge it.

    A coroutine on the caller's event loop; its queries run one after the other, each
    bounded by ``prometheus.timeout`` and all by the analysis's total deadline
    (:mod:`tinct.operator.grayrelease.prometheus`). A Prometheus that fails makes the result
    ``Inconclusive``, its message naming the Prometheus and the problem.

    Args:
        spec: the release's analysis settings.
        namespace: the GrayRelease's namespace.
        release: the GrayRelease's name.
        now: the time of the analysis, the end of its window.
        prometheus: the Prometheus to read (:func:`~tinct.operator.grayrelease.prometheus.resolve`
            of ``spec.prometheus``).
        cells: cell name -> dye tags (:func:`~tinct.operator.grayrelease.tables.cells_by_tag`);
            give them with or without ``spec.perCell``: ``maxStableDelta`` compares the sides
            cell by cell.
        cutoff_ms: the routers' fallback latency limit (``spec.fallback.latencyMs``).
        sides: ``candidate`` and ``stable`` backends, whose ``engine`` and
            ``metricsSelector`` (default: ``namespace`` and their ``service``) the engine
            metrics read.
        session: the session to query through
            (:func:`~tinct.operator.grayrelease.prometheus.client_session`); None: one of its own.
        live: some cell sends the candidate live traffic (False at a dark step: the router
            built-ins are not read nor judged).
        shadowed: the cells whose shadow share is above 0 at this step.
    """
    window = spec.interval
    results: dict[str, list[dict[str, Any]]] = {}
    custom: dict[int, float | str] = {}
    engines: dict[int, tuple[Reading, Reading | None]] = {}
    builtins = {m.name for m in spec.metrics if m.name != "custom"}
    router = builtins - {SHADOW_METRIC}
    pairs: agreement.PairSamples | None = None
    try:
        async with querying(prometheus, session=session, at=now) as query:
            if router and live:
                for key, promql in queries(namespace, release, window, router).items():
                    results[key] = await query(promql)
            if SHADOW_METRIC in builtins:
                pairs = agreement.pair_samples(await query(agreement.query(namespace, release, window)))
            if builtins & set(ENGINE_METRICS):
                engines = await _engine_readings(query, spec, sides or {}, namespace, window)
            for i, m in enumerate(spec.metrics):
                if m.name == "custom" and m.query:
                    try:
                        custom[i] = _custom_value(
                            await query(custom_query(m.query, namespace, release, window))
                        )
                    except PrometheusError as exc:
                        raise PrometheusError(
                            exc.target, f"{exc.problem} (the query of metrics[{i}])"
                        ) from None
    except PrometheusError as exc:
        return inconclusive(spec, now, str(exc))
    return evaluate(
        spec,
        samples_from(results),
        custom,
        now,
        cells,
        cutoff_ms,
        engines,
        pairs=pairs,
        live=live,
        shadowed=shadowed,
    )
