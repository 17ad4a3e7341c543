"""Analysis of a release's candidate from the router's metrics in Prometheus.

Four PromQL queries per analysis read what the routers export for one release, selected by
its namespace and name, over the last interval, grouped by side and dye tag
(``tinct_router_requests_total``, the fallbacks, the truncated answers, the time-to-first-byte
histogram); the verdicts are computed here, so the same numbers judge the whole candidate
and, with ``analysis.perCell``, every dye cell.

What counts is what users saw:

- ``success-rate`` (percent) is the share of the requests the candidate got that it
  answered whole and without a 5xx. A request the router sent to the candidate but answered
  from stable (a fallback: 5xx, 426, unreachable, too slow) counts against it; an answer cut
  after its headers (``tinct_router_truncated_responses_total``) counts against the side
  that cut it, stable included, whatever status ``tinct_router_requests_total`` recorded. An
  ``ejected`` fallback went to stable while the candidate sat out its cooldown, untried: it
  counts neither for nor against the candidate, but towards ``minRequests`` (the candidate's
  share was there; a candidate failing hard is tried a few times per cooldown only, and
  those few tries are what judges it).
- ``latency-p95`` is in milliseconds, from the TTFB histogram, interpolated within buckets as
  ``histogram_quantile`` does; a ``latency_too_high`` fallback counts as an observation above
  every bucket, and a p95 among them as at least the routers' latency limit.
- ``maxStableDelta`` compares like with like: with cells of different weights the candidate
  and stable serve different mixes of cells, so the difference is taken in each cell (each dye
  tag when no cells are given) where both sides have data, and the cells' differences are
  averaged weighted by the candidate's requests in each; no such cell is inconclusive.
- Custom metrics run their PromQL as written, with ``$namespace``, ``$release`` and
  ``$interval`` replaced; the query must return one number.
- Fewer candidate requests than ``minRequests``, no data, NaN or an infinity, more than one
  series, Prometheus unreachable or answering an error: the verdict is ``Inconclusive`` with
  the reason in the message, never ``Fail``. A result never holds a non-finite number: it is
  written to status, which is JSON.

:func:`evaluate` is pure; :func:`analyse` is a coroutine that queries Prometheus through the
bounded client of :mod:`tinct.operator.release.prometheus` (deadlines, a cap on the body, no
answer quoted in a message) and hands the answers to :func:`evaluate`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from tinct.api.v1alpha1.grayrelease import Analysis, AnalysisResult, CellResult, Metric, MetricResult, Verdict
from tinct.operator.release.prometheus import PrometheusError, PrometheusTarget, querying, selector

__all__ = [
    "Samples",
    "analyse",
    "custom_query",
    "evaluate",
    "quantile",
    "queries",
    "samples_from",
]

Buckets = dict[float, float]  # upper bound -> cumulative count

#: The fallback reason of a request the candidate never got (it was in its cooldown).
EJECTED = "ejected"
#: The fallback reason of a candidate answer slower than the routers' latency limit.
TOO_SLOW = "latency_too_high"


@dataclass
class Side:
    """What one side served for one dye tag over the window."""

    served: float = 0.0
    errors: float = 0.0  # answered 5xx
    truncated: float = 0.0  # cut after their headers; ``served`` counted them with their status
    ttfb: Buckets = field(default_factory=dict)

    @property
    def ok(self) -> float:
        """Answers the client got whole and without a 5xx."""
        return self.served - min(self.served, self.errors + self.truncated)


@dataclass
class Samples:
    """Everything the built-in metrics need, per dye tag."""

    #: (side, dye_tag) -> Side
    sides: dict[tuple[str, str], Side] = field(default_factory=dict)
    #: (dye_tag, reason) -> candidate requests answered by stable instead
    fallbacks: dict[tuple[str, str], float] = field(default_factory=dict)
    #: query -> the non-finite value (or unparsable bucket bound) it answered, as written in
    #: messages; any makes the built-in metrics inconclusive.
    non_finite: dict[str, str] = field(default_factory=dict)

    def side(self, side: str, tag: str) -> Side:
        return self.sides.setdefault((side, tag), Side())


def queries(namespace: str, release: str, window: str) -> dict[str, str]:
    """The PromQL reading the router metrics of the release ``namespace/release`` over
    ``window`` (e.g. ``1m``); a release of the same name in another namespace is not read."""
    sel = selector(namespace=namespace, release=release)
    return {
        "requests": f"sum by (side, dye_tag, code) (increase(tinct_router_requests_total{{{sel}}}[{window}]))",
        "fallbacks": f"sum by (dye_tag, reason) (increase(tinct_router_fallbacks_total{{{sel}}}[{window}]))",
        "truncated": "sum by (side, dye_tag) "
        f"(increase(tinct_router_truncated_responses_total{{{sel}}}[{window}]))",
        "ttfb": "sum by (side, dye_tag, le) "
        f"(increase(tinct_router_time_to_first_byte_seconds_bucket{{{sel}}}[{window}]))",
    }


def _prom(value: float) -> str:
    """A non-finite float as Prometheus writes it."""
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _value(sample: Mapping[str, Any]) -> float:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


def samples_from(results: Mapping[str, list[dict[str, Any]]]) -> Samples:
    """Fold the vectors answered for :func:`queries` into :class:`Samples`."""
    out = Samples()

    def rows(query: str) -> Iterable[tuple[Mapping[str, Any], float]]:
        for s in results.get(query, []):
            v = _value(s)
            if math.isfinite(v):
                yield s.get("metric", {}), v
            else:
                out.non_finite.setdefault(query, _prom(v))

    for m, v in rows("requests"):
        side = out.side(m.get("side", ""), m.get("dye_tag", ""))
        side.served += v
        if str(m.get("code", "")).startswith("5"):
            side.errors += v
    for m, v in rows("fallbacks"):
        key = (m.get("dye_tag", ""), m.get("reason", ""))
        out.fallbacks[key] = out.fallbacks.get(key, 0.0) + v
    for m, v in rows("truncated"):
        out.side(m.get("side", ""), m.get("dye_tag", "")).truncated += v
    for m, v in rows("ttfb"):
        try:
            le = float(m.get("le", "+Inf"))
        except (TypeError, ValueError):
            le = math.nan
        if math.isnan(le):
            out.non_finite.setdefault("ttfb", "a bucket bound that is not a number")
            continue
        b = out.side(m.get("side", ""), m.get("dye_tag", "")).ttfb
        b[le] = b.get(le, 0.0) + v
    return out


def quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q`` quantile of a cumulative histogram, as Prometheus's ``histogram_quantile``."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0 or math.isnan(total) or not any(not math.isinf(le) for le in bounds):
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


@dataclass
class _Group:
    requests: float = 0.0  # the candidate got: served there or fallen back after trying it
    #: chosen for the candidate while it sat out an ejection: they count towards minRequests
    #: (the candidate's share was there) but neither for nor against it
    ejected: float = 0.0
    cand_ok: float = 0.0
    cand_ttfb: Buckets = field(default_factory=dict)
    slow: float = 0.0
    stable_served: float = 0.0
    stable_ok: float = 0.0
    stable_ttfb: Buckets = field(default_factory=dict)


def _add(dst: Buckets, src: Buckets) -> None:
    for le, n in src.items():
        dst[le] = dst.get(le, 0.0) + n


def _group(samples: Samples, tags: Iterable[str] | None) -> _Group:
    wanted = None if tags is None else set(tags)
    g = _Group()
    for (side, tag), s in samples.sides.items():
        if wanted is not None and tag not in wanted:
            continue
        if side == "candidate":
            g.requests += s.served
            g.cand_ok += s.ok
            _add(g.cand_ttfb, s.ttfb)
        elif side == "stable":
            g.stable_served += s.served
            g.stable_ok += s.ok
            _add(g.stable_ttfb, s.ttfb)
    for (tag, reason), n in samples.fallbacks.items():
        if wanted is not None and tag not in wanted:
            continue
        if reason == EJECTED:
            g.ejected += n
            continue
        g.requests += n
        if reason == TOO_SLOW:
            g.slow += n
    if g.slow:
        inf = math.inf
        g.cand_ttfb[inf] = g.cand_ttfb.get(inf, 0.0) + g.slow
    return g


def _partition(samples: Samples, cells: Mapping[str, list[str]] | None) -> list[list[str]]:
    """The dye tag groups stable is compared with the candidate in: the cells, else each tag.

    A tag of the window that no cell lists (one of an older table) is a group of its own.
    """
    seen = dict.fromkeys([tag for _, tag in samples.sides] + [tag for tag, _ in samples.fallbacks])
    listed = {t for tags in (cells or {}).values() for t in tags}
    return [list(tags) for tags in (cells or {}).values()] + [[t] for t in seen if t not in listed]


def _threshold(m: Metric) -> str:
    parts = []
    if m.min is not None:
        parts.append(f">= {m.min:g}")
    if m.max is not None:
        parts.append(f"<= {m.max:g}")
    if m.max_ms is not None:
        parts.append(f"<= {m.max_ms:g} ms")
    if m.max_stable_delta is not None:
        unit = " ms" if m.name == "latency-p95" else " pp"
        parts.append(f"within {m.max_stable_delta:g}{unit} of stable")
    return ", ".join(parts)


@dataclass(frozen=True)
class _Versus:
    """The candidate against stable, cell by cell."""

    worse: float  # how much worse the candidate is, weighted by its requests in each cell
    stable: float  # stable's value in the candidate's mix of cells
    cells: int  # the cells compared


def _sides(m: Metric, g: _Group, cutoff_ms: float | None) -> tuple[float | None, float | None, bool]:
    """The candidate's and stable's value of built-in ``m`` in ``g``, and whether the
    candidate's was raised to the routers' latency limit."""
    if m.name == "success-rate":
        value = 100.0 * g.cand_ok / g.requests if g.requests else None
        stable = 100.0 * g.stable_ok / g.stable_served if g.stable_served else None
        return value, stable, False
    q = quantile(0.95, g.cand_ttfb)
    sq = quantile(0.95, g.stable_ttfb)
    value = None if q is None else q * 1000.0
    cut = bool(g.slow) and cutoff_ms is not None and _beyond_buckets(0.95, g.cand_ttfb)
    if cut and cutoff_ms is not None:
        # The p95 request was cut off by the router's latency limit: it took longer than that.
        value = max(value or 0.0, cutoff_ms)
    return value, None if sq is None else sq * 1000.0, cut


def _versus(m: Metric, parts: Sequence[_Group], cutoff_ms: float | None) -> _Versus | None:
    """Stable against the candidate in each part where both have data, weighted by the
    candidate's requests there; None when no part has both."""
    weight = worse = stable = 0.0
    cells = 0
    for g in parts:
        value, sv, _ = _sides(m, g, cutoff_ms)
        if value is None or sv is None or not g.requests > 0:
            continue
        delta = sv - value if m.name == "success-rate" else value - sv
        weight += g.requests
        worse += g.requests * delta
        stable += g.requests * sv
        cells += 1
    if not cells:
        return None
    return _Versus(worse=worse / weight, stable=stable / weight, cells=cells)


def _unjudged(m: Metric, why: str) -> MetricResult:
    return MetricResult(name=m.name, threshold=_threshold(m), verdict="Inconclusive", message=why)


def _judge(m: Metric, value: float | None, versus: _Versus | None = None) -> MetricResult:
    if value is None:
        return _unjudged(m, "no data")
    if not math.isfinite(value):
        return _unjudged(m, f"the value is {_prom(value)}, not a finite number")
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
                msgs.append("no stable data to compare with")
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


def _builtin(m: Metric, g: _Group, cutoff_ms: float | None, parts: Sequence[_Group]) -> MetricResult:
    """Judge built-in ``m`` on ``g``; ``parts`` are the cells stable is compared in."""
    value, _, cut = _sides(m, g, cutoff_ms)
    if cut and m.max_ms is not None and value is not None and math.isfinite(value) and value >= m.max_ms:
        return MetricResult(
            name=m.name,
            value=value,
            threshold=_threshold(m),
            verdict="Fail",
            message=f"p95 > {cutoff_ms:g} ms: requests fell back at the latency limit",
        )
    versus = _versus(m, parts, cutoff_ms) if m.max_stable_delta is not None else None
    return _judge(m, value, versus)


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
        return f"the candidate's request count is {_prom(requests)}, not a finite number"
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
) -> AnalysisResult:
    """Judge one window.

    Args:
        spec: the release's analysis settings.
        samples: the router metrics of the window (:func:`samples_from`).
        custom: index in ``spec.metrics`` of each custom metric -> its value, or a string
            saying why there is none.
        now: the time of the analysis.
        cells: cell name -> dye tags it takes: the cells judged with ``spec.perCell``, and
            the cells ``maxStableDelta`` compares the sides in (without them: each dye tag).
        cutoff_ms: the routers' fallback latency limit; a request that fell back for being
            slower took at least this long.
    """
    overall = _group(samples, None)
    parts = [_group(samples, tags) for tags in _partition(samples, cells)]
    unusable = None
    if samples.non_finite:
        answered = ", ".join(f"{v} for {q}" for q, v in samples.non_finite.items())
        unusable = f"Prometheus answered {answered}, not a finite number"
    few = _too_few(overall.requests + overall.ejected, spec.min_requests)
    results: list[MetricResult] = []
    for i, m in enumerate(spec.metrics):
        if m.name == "custom":
            got = custom.get(i, "not queried")
            results.append(_unjudged(m, got) if isinstance(got, str) else _judge(m, got))
            continue
        if unusable:
            results.append(_unjudged(m, unusable))
            continue
        r = _builtin(m, overall, cutoff_ms, parts)
        if few and r.verdict != "Inconclusive":
            r = r.model_copy(update={"verdict": "Inconclusive", "message": few})
        results.append(r)
    cell_results: list[CellResult] = []
    if spec.per_cell and cells:
        builtins = [m for m in spec.metrics if m.name != "custom"]
        for name, tags in cells.items():
            g = _group(samples, tags)
            counted = g.requests if math.isfinite(g.requests) else 0.0
            if unusable or _too_few(g.requests + g.ejected, spec.min_requests):
                cell_results.append(CellResult(cell=name, requests=counted, verdict="Inconclusive"))
                continue
            ms = [_builtin(m, g, cutoff_ms, [g]) for m in builtins]
            cell_results.append(
                CellResult(cell=name, requests=counted, verdict=_combine(m.verdict for m in ms), metrics=ms)
            )
    verdict = _combine(r.verdict for r in results)
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
    return AnalysisResult(
        time=now,
        verdict=verdict,
        metrics=results,
        requests=overall.requests if math.isfinite(overall.requests) else None,
        message=message,
        cells=cell_results,
    )


def _inconclusive(spec: Analysis, now: datetime, why: str) -> AnalysisResult:
    metrics = [
        MetricResult(name=m.name, threshold=_threshold(m), verdict="Inconclusive", message=why)
        for m in spec.metrics
    ]
    return AnalysisResult(time=now, verdict="Inconclusive", metrics=metrics, message=f"inconclusive: {why}")


def _custom_value(rows: list[dict[str, Any]]) -> float | str:
    if not rows:
        return "the query returned no data"
    if len(rows) > 1:
        return f"the query returned {len(rows)} series; aggregate it to one number (e.g. sum(...))"
    v = _value(rows[0])
    if not math.isfinite(v):
        return f"the query returned {_prom(v)}, not a finite number"
    return v


def custom_query(query: str, namespace: str, release: str, window: str) -> str:
    """A custom metric's PromQL with ``$namespace``, ``$release`` and ``$interval`` replaced."""
    return query.replace("$namespace", namespace).replace("$release", release).replace("$interval", window)


async def analyse(
    spec: Analysis,
    namespace: str,
    release: str,
    now: datetime,
    *,
    prometheus: PrometheusTarget,
    cells: Mapping[str, list[str]] | None = None,
    cutoff_ms: float | None = None,
    session: aiohttp.ClientSession | None = None,
) -> AnalysisResult:
    """Query Prometheus for the ``spec.interval`` up to ``now`` of the release and judge it.

    A coroutine on the caller's event loop; its queries run one after the other, each
    bounded by ``prometheus.timeout`` and all by the analysis's total deadline
    (:mod:`tinct.operator.release.prometheus`). A Prometheus that fails makes the result
    ``Inconclusive``, its message naming the Prometheus and the problem.

    Args:
        spec: the release's analysis settings.
        namespace: the GrayRelease's namespace.
        release: the GrayRelease's name.
        now: the time of the analysis, the end of its window.
        prometheus: the Prometheus to read (:func:`~tinct.operator.release.prometheus.resolve`
            of ``spec.prometheus``).
        cells: cell name -> dye tags (:func:`~tinct.operator.release.tables.cells_by_tag`);
            give them with or without ``spec.perCell``: ``maxStableDelta`` compares the sides
            cell by cell.
        cutoff_ms: the routers' fallback latency limit (``spec.fallback.latencyMs``).
        session: the session to query through
            (:func:`~tinct.operator.release.prometheus.client_session`); None: one of its own.
    """
    window = spec.interval
    results: dict[str, list[dict[str, Any]]] = {}
    custom: dict[int, float | str] = {}
    try:
        async with querying(prometheus, session=session, at=now) as query:
            if any(m.name != "custom" for m in spec.metrics):
                for key, promql in queries(namespace, release, window).items():
                    results[key] = await query(promql)
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
        return _inconclusive(spec, now, str(exc))
    return evaluate(spec, samples_from(results), custom, now, cells, cutoff_ms)
