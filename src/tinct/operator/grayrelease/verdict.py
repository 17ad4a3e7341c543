"""The verdict of one analysis window, from what was read of it; pure.

The built-ins read from the routers (:mod:`tinct.operator.grayrelease.samples`) are computed
here, so the same numbers judge the whole candidate and, with ``analysis.perCell``, every dye
cell; the engine metrics come as the readings of each side's own engine
(:mod:`tinct.operator.grayrelease.engine`). :func:`evaluate` judges them;
:mod:`~tinct.operator.grayrelease.analysis` reads them from Prometheus first.

What counts is what users saw:

- ``success-rate`` (percent) is the share of the requests the candidate got that it
  answered whole and without a 5xx. A request the router sent to the candidate but answered
  from stable (a fallback: 5xx, 426, unreachable, too slow) counts against it; an answer cut
  after its headers (``tinct_router_truncated_responses_total``) counts against the side
  that cut it, stable included, whatever status ``tinct_router_requests_total`` recorded. An
  ``ejected`` fallback went to stable while the candidate sat out its cooldown, untried: it
  counts neither for nor against the candidate, but towards ``minRequests`` (the candidate's
  share was there; a candidate failing hard is tried a few times per cooldown only, and
  those few tries are what judges it). A 429 is an answer, not a failure: ``throttle-rate``
  judges it.
- ``latency-p95``, ``ttft-p95`` and ``itl-p95`` are in milliseconds, the ``quantile`` (0.95
  unless given) of the time-to-first-byte, time-to-first-token and inter-token-latency
  histograms, interpolated within buckets as ``histogram_quantile`` does; a
  ``latency_too_high`` fallback counts as an observation above every bucket of the first two
  (no head, so no token, came within the limit), and a quantile among them as at least the
  routers' latency limit.
- ``throttle-rate`` is the percent of the candidate's requests answered 429;
  ``contract-violations`` the OpenAI contract violations per 100 answers it served.
- ``queue-depth`` (requests), ``kv-cache-usage`` and ``prefix-cache-hit-rate`` (percent)
  come from the engines; an engine without the metric, or no series, is inconclusive.
- ``maxStableDelta`` compares like with like: with cells of different weights the candidate
  and stable serve different mixes of cells, so for router metrics the difference is taken in
  each cell (each dye tag when no cells are given) where both sides have data, and the
  cells' differences are averaged weighted by the candidate's requests in each; no such
  cell is inconclusive. Engine metrics compare the two sides' engines as a whole.
- Custom metrics are judged on the one number their PromQL returned.
- ``shadow-agreement`` is judged on the comparer's pairs (:mod:`~tinct.operator.grayrelease.agreement`),
  per cell and overall, with its own ``minPairs``; ``minRequests`` does not apply to it.
- At a **dark step** (no cell sends the candidate live traffic: every weight 0) the router
  built-ins have no candidate requests to judge: they are left out, not held inconclusive,
  and the message says so, and ``minRequests`` does not hold the others. The step is judged
  by what else the analysis names (``shadow-agreement``, engine and custom metrics); with
  nothing else it passes, as a step without analysis metrics does (the candidate answered
  no one).
- Fewer candidate requests than ``minRequests``, no data, NaN or an infinity, more than one
  series, Prometheus unreachable or answering an error: the verdict is ``Inconclusive`` with
  the reason in the message, never ``Fail``. A result never holds a non-finite number: it is
  written to status, which is JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from tinct.api.v1alpha1.analysis import ENGINE_METRICS, ROUTER_METRICS, SHADOW_METRIC
from tinct.api.v1alpha1.grayrelease import (
    Analysis,
    AnalysisResult,
    CellResult,
    Metric,
    MetricResult,
    ShadowResult,
    Verdict,
)
from tinct.operator.grayrelease import agreement
from tinct.operator.grayrelease.engine import Reading
from tinct.operator.grayrelease.samples import Buckets, Group, Samples, group, prom_number, quantile

__all__ = ["EngineReadings", "evaluate", "inconclusive"]

#: Engine metric readings: index in ``spec.metrics`` -> (candidate's, stable's or None).
EngineReadings = Mapping[int, tuple[Reading, Reading | None]]
#: Built-ins where a higher value is better (the others: lower is better).
_HIGHER_IS_BETTER = frozenset({"success-rate", "prefix-cache-hit-rate"})
_UNIT = {
    "latency-p95": " ms",
    "ttft-p95": " ms",
    "itl-p95": " ms",
    "queue-depth": " requests",
}
#: Quantile built-in -> the histogram of a side it reads.
_HISTOGRAM = {"latency-p95": "ttfb", "ttft-p95": "ttft", "itl-p95": "itl"}


def _partition(samples: Samples, cells: Mapping[str, list[str]] | None) -> list[list[str]]:
    """The dye tag groups stable is compared with the candidate in: the cells, else each tag.

    A tag of the window that no cell lists (one of an older table) is a group of its own.
    """
    seen = dict.fromkeys([tag for _, tag in samples.sides] + [tag for tag, _ in samples.fallbacks])
    listed = {t for tags in (cells or {}).values() for t in tags}
    return [list(tags) for tags in (cells or {}).values()] + [[t] for t in seen if t not in listed]


def _threshold(m: Metric) -> str:
    parts = []
    unit = _UNIT.get(m.name, "")
    if m.min is not None:
        parts.append(f">= {m.min:g}{unit}")
    if m.max is not None:
        parts.append(f"<= {m.max:g}{unit}")
    if m.max_ms is not None:
        parts.append(f"<= {m.max_ms:g} ms")
    if m.max_stable_delta is not None:
        parts.append(f"within {m.max_stable_delta:g}{unit or ' pp'} of stable")
    if m.quantile is not None:
        parts.append(f"q{m.quantile:g}")
    return ", ".join(parts)


@dataclass(frozen=True)
class _Versus:
    """The candidate against stable, cell by cell."""

    worse: float  # how much worse the candidate is, weighted by its requests in each cell
    stable: float  # stable's value in the candidate's mix of cells
    cells: int  # the cells compared


def _percent(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole else None


def _sides(m: Metric, g: Group, cutoff_ms: float | None) -> tuple[float | None, float | None, bool]:
    """The candidate's and stable's value of router built-in ``m`` in ``g``, and whether the
    candidate's was raised to the routers' latency limit."""
    cand, stable = g.candidate, g.stable
    if m.name == "success-rate":
        return _percent(cand.ok, g.requests), _percent(stable.ok, stable.served), False
    if m.name == "throttle-rate":
        return _percent(cand.throttled, g.requests), _percent(stable.throttled, stable.served), False
    if m.name == "contract-violations":
        return _percent(cand.violations, cand.served), _percent(stable.violations, stable.served), False
    q = m.quantile or 0.95
    histogram = _HISTOGRAM[m.name]
    buckets: Buckets = getattr(cand, histogram)
    cq = quantile(q, buckets)
    sq = quantile(q, getattr(stable, histogram))
    value = None if cq is None else cq * 1000.0
    cut = histogram != "itl" and bool(g.slow) and cutoff_ms is not None and _beyond_buckets(q, buckets)
    if cut and cutoff_ms is not None:
        # The quantile's request was cut off by the router's latency limit: it took longer than that.
        value = max(value or 0.0, cutoff_ms)
    return value, None if sq is None else sq * 1000.0, cut


def _worse(m: Metric, value: float, stable: float) -> float:
    """How much worse ``value`` is than stable's, in the metric's unit."""
    return stable - value if m.name in _HIGHER_IS_BETTER else value - stable


def _versus(m: Metric, parts: Sequence[Group], cutoff_ms: float | None) -> _Versus | None:
    """Stable against the candidate in each part where both have data, weighted by the
    candidate's requests there; None when no part has both."""
    weight = worse = stable = 0.0
    cells = 0
    for g in parts:
        value, sv, _ = _sides(m, g, cutoff_ms)
        if value is None or sv is None or not g.requests > 0:
            continue
        weight += g.requests
        worse += g.requests * _worse(m, value, sv)
        stable += g.requests * sv
        cells += 1
    if not cells:
        return None
    return _Versus(worse=worse / weight, stable=stable / weight, cells=cells)


def _unjudged(m: Metric, why: str, series: str | None = None) -> MetricResult:
    return MetricResult(
        name=m.name, threshold=_threshold(m), verdict="Inconclusive", message=why, series=series
    )


def _judge(
    m: Metric, value: float | None, versus: _Versus | None = None, *, no_stable: str | None = None
) -> MetricResult:
    if value is None:
        return _unjudged(m, "no data")
    if not math.isfinite(value):
        return _unjudged(m, f"the value is {prom_number(value)}, not a finite number")
    msgs = []
    if m.min is not None and value < m.min:
        msgs.append(f"{value:.4g} < {m.min:g}")
    if m.max is not None and value > m.max:
        msgs.append(f"{value:.4g} > {m.max:g}")
    if m.max_ms is not None and value > m.max_ms:
        msgs.append(f"{value:.4g} ms > {m.max_ms:g} ms")
    verdict: Verdict = "Fail" if msgs else "Pass"
    stable: float | None = None
    if m.max_stable_delta is not None:
        if versus is None or not (math.isfinite(versus.worse) and math.isfinite(versus.stable)):
            if verdict == "Pass":
                verdict = "Inconclusive"
            if versus is None:
                msgs.append(no_stable or "no stable data to compare with")
            else:
                msgs.append("the comparison with stable is not a finite number")
        else:
            stable = versus.stable
            if versus.worse > m.max_stable_delta:
                verdict = "Fail"
                over = (
                    f", over {versus.cells} cells weighted by candidate requests" if versus.cells > 1 else ""
                )
                msgs.append(f"{versus.worse:.4g} worse than stable ({stable:.4g}){over}")
    return MetricResult(
        name=m.name,
        value=value,
        threshold=_threshold(m),
        verdict=verdict,
        message="; ".join(msgs) or None,
        stable_value=stable,
    )


def _beyond_buckets(q: float, buckets: Buckets) -> bool:
    """Whether the ``q`` quantile falls above the last finite bucket bound."""
    finite = [le for le in buckets if not math.isinf(le)]
    total = max(buckets.values(), default=0.0)
    below = buckets[max(finite)] if finite else 0.0
    return total > 0 and below < q * total


def _builtin(m: Metric, g: Group, cutoff_ms: float | None, parts: Sequence[Group]) -> MetricResult:
    """Judge router built-in ``m`` on ``g``; ``parts`` are the cells stable is compared in."""
    value, _, cut = _sides(m, g, cutoff_ms)
    if cut and m.max_ms is not None and value is not None and math.isfinite(value) and value >= m.max_ms:
        q = m.quantile or 0.95
        return MetricResult(
            name=m.name,
            value=value,
            threshold=_threshold(m),
            verdict="Fail",
            message=f"p{100 * q:g} > {cutoff_ms:g} ms: requests fell back at the latency limit",
        )
    versus = _versus(m, parts, cutoff_ms) if m.max_stable_delta is not None else None
    return _judge(m, value, versus)


def _engine(m: Metric, readings: tuple[Reading, Reading | None] | None) -> MetricResult:
    """Judge engine metric ``m`` on the candidate's reading (and stable's, for maxStableDelta)."""
    if readings is None:
        return _unjudged(m, "not queried")
    cand, stable = readings
    if cand.value is None:
        return _unjudged(m, cand.why or "no data", cand.series)
    versus = None
    no_stable = None
    if m.max_stable_delta is not None:
        if stable is None:
            no_stable = "no stable data to compare with: spec.stable names no engine"
        elif stable.value is None:
            no_stable = f"no stable data to compare with: {stable.why or 'no data'}"
        else:
            versus = _Versus(worse=_worse(m, cand.value, stable.value), stable=stable.value, cells=1)
    r = _judge(m, cand.value, versus, no_stable=no_stable)
    return r.model_copy(update={"series": cand.series})


def _combine(verdicts: Iterable[Verdict]) -> Verdict:
    vs = list(verdicts)
    if "Fail" in vs:
        return "Fail"
    if "Inconclusive" in vs or "Error" in vs or not vs:
        return "Inconclusive"
    return "Pass"


def _too_few(requests: float, min_requests: int) -> str | None:
    """Why ``requests`` candidate requests give no verdict, if they do not."""
    if not math.isfinite(requests):
        return f"the candidate's request count is {prom_number(requests)}, not a finite number"
    if requests < min_requests:
        return f"{requests:.0f} candidate requests < minRequests {min_requests}"
    return None


def evaluate(
    spec: Analysis,
    samples: Samples,
    custom: Mapping[int, float | str],
    now: datetime,
    cells: Mapping[str, list[str]] | None = None,
    cutoff_ms: float | None = None,
    engines: EngineReadings | None = None,
    *,
    pairs: agreement.PairSamples | None = None,
    live: bool = True,
    shadowed: Iterable[str] = (),
) -> AnalysisResult:
    """Judge one window.

    Args:
        spec: the release's analysis settings.
        samples: the router metrics of the window (:func:`~tinct.operator.grayrelease.samples.samples_from`).
        custom: index in ``spec.metrics`` of each custom metric -> its value, or a string
            saying why there is none.
        now: the time of the analysis.
        cells: cell name -> dye tags it takes: the cells judged with ``spec.perCell``, and
            the cells ``maxStableDelta`` compares the sides in (without them: each dye tag).
        cutoff_ms: the routers' fallback latency limit; a request that fell back for being
            slower took at least this long.
        engines: index in ``spec.metrics`` of each engine metric -> the candidate's and
            stable's readings (:func:`~tinct.operator.grayrelease.engine.reading_from`).
        pairs: the comparer's pairs of the window, for ``shadow-agreement``.
        live: some cell sends the candidate live traffic; False at a dark step, where the
            router built-ins are not judged.
        shadowed: the cells whose shadow share is above 0 (shown even without pairs).
    """
    overall = group(samples, None)
    parts = [group(samples, tags) for tags in _partition(samples, cells)]
    unusable = None
    if samples.non_finite:
        answered = ", ".join(f"{v} for {q}" for q, v in samples.non_finite.items())
        unusable = f"Prometheus answered {answered}, not a finite number"
    few = _too_few(overall.requests + overall.ejected, spec.min_requests) if live else None
    results: list[MetricResult] = []
    shadow: ShadowResult | None = None
    dark = [m.name for m in spec.metrics if not live and m.name in ROUTER_METRICS]
    for i, m in enumerate(spec.metrics):
        if m.name == SHADOW_METRIC:
            if pairs is None:
                results.append(_unjudged(m, "not queried"))
            else:
                r, shadow = agreement.judge(m, pairs, cells, shadowed)
                results.append(r)
            continue
        if m.name in dark:
            continue
        if m.name == "custom":
            got = custom.get(i, "not queried")
            results.append(_unjudged(m, got) if isinstance(got, str) else _judge(m, got))
            continue
        if unusable:
            results.append(_unjudged(m, unusable))
            continue
        if m.name in ENGINE_METRICS:
            r = _engine(m, (engines or {}).get(i))
        else:
            r = _builtin(m, overall, cutoff_ms, parts)
        if few and r.verdict != "Inconclusive":
            r = r.model_copy(update={"verdict": "Inconclusive", "message": few})
        results.append(r)
    cell_results: list[CellResult] = []
    if spec.per_cell and cells and live:
        builtins = [m for m in spec.metrics if m.name in ROUTER_METRICS]
        for name, tags in cells.items():
            g = group(samples, tags)
            counted = g.requests if math.isfinite(g.requests) else 0.0
            if unusable or _too_few(g.requests + g.ejected, spec.min_requests):
                cell_results.append(CellResult(cell=name, requests=counted, verdict="Inconclusive"))
                continue
            ms = [_builtin(m, g, cutoff_ms, [g]) for m in builtins]
            cell_results.append(
                CellResult(cell=name, requests=counted, verdict=_combine(m.verdict for m in ms), metrics=ms)
            )
    verdict = _combine(r.verdict for r in results) if results or not dark else "Pass"
    judged = [c.verdict for c in cell_results if c.verdict != "Inconclusive"]
    if "Fail" in judged:
        verdict = "Fail"
    message = None
    if verdict == "Inconclusive":
        why = [f"{r.name}: {r.message}" for r in results if r.verdict == "Inconclusive" and r.message]
        message = "inconclusive: " + ("; ".join(dict.fromkeys(why)) or "no verdict")
    elif verdict == "Fail":
        bad = [f"{r.name} {r.message}" for r in results if r.verdict == "Fail"]
        bad += [f"cell {c.cell} failed" for c in cell_results if c.verdict == "Fail"]
        message = "failed: " + "; ".join(bad)
    elif shadow is not None or dark:
        said = [
            f"{r.name} {r.value:.4g} ({r.message})"
            for r in results
            if r.name == SHADOW_METRIC and r.value is not None
        ]
        message = "; ".join(said) or None
    if dark:
        note = f"dark step: {', '.join(dict.fromkeys(dark))} not judged (no cell sends the candidate live traffic)"
        message = f"{message}; {note}" if message else note
    return AnalysisResult(
        time=now,
        verdict=verdict,
        metrics=results,
        requests=overall.requests if math.isfinite(overall.requests) else None,
        message=message,
        cells=cell_results,
        shadow=shadow,
    )


def inconclusive(spec: Analysis, now: datetime, why: str) -> AnalysisResult:
    """The verdict of a window that could not be read: every metric inconclusive, for ``why``."""
    metrics = [
        MetricResult(name=m.name, threshold=_threshold(m), verdict="Inconclusive", message=why)
        for m in spec.metrics
    ]
    return AnalysisResult(time=now, verdict="Inconclusive", metrics=metrics, message=f"inconclusive: {why}")
