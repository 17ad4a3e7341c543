"""Analysis of a release's candidate from the router's metrics in Prometheus.

Three PromQL queries per analysis read what the routers export for one release over the
last interval, grouped by side and dye tag (``tinct_router_requests_total``, the fallbacks,
the time-to-first-byte histogram); the verdicts are computed here, so the same numbers judge
the whole candidate and, with ``analysis.perCell``, every dye cell.

- A request the router sent to the candidate but answered from stable (a fallback: 5xx,
  426, unreachable, too slow, ejected) counts against the candidate's success rate, and a
  ``latency_too_high`` fallback counts as an observation above every latency bucket.
- ``success-rate`` is in percent, ``latency-p95`` in milliseconds (from the TTFB histogram,
  interpolated within buckets as ``histogram_quantile`` does).
- Custom metrics run their PromQL as written, with ``$release`` and ``$interval`` replaced;
  the query must return one number.
- Fewer candidate requests than ``minRequests``, no data, NaN, more than one series,
  Prometheus unreachable or answering an error: the verdict is ``Inconclusive`` with the
  reason in the message, never ``Fail``.

:func:`evaluate` is pure; :func:`analyse` does the blocking HTTP (run it in a thread).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tinct.api.v1alpha1.grayrelease import Analysis, AnalysisResult, CellResult, Metric, MetricResult, Verdict

__all__ = [
    "Samples",
    "analyse",
    "evaluate",
    "quantile",
    "queries",
    "samples_from",
]

Buckets = dict[float, float]  # upper bound -> cumulative count


@dataclass
class Side:
    """What one side served for one dye tag over the window."""

    served: float = 0.0
    errors: float = 0.0  # answered 5xx
    ttfb: Buckets = field(default_factory=dict)


@dataclass
class Samples:
    """Everything the built-in metrics need, per dye tag."""

    #: (side, dye_tag) -> Side
    sides: dict[tuple[str, str], Side] = field(default_factory=dict)
    #: (dye_tag, reason) -> candidate requests answered by stable instead
    fallbacks: dict[tuple[str, str], float] = field(default_factory=dict)

    def side(self, side: str, tag: str) -> Side:
        return self.sides.setdefault((side, tag), Side())


def _sel(release: str) -> str:
    escaped = release.replace("\\", "\\\\").replace('"', '\\"')
    return f'release="{escaped}"'


def queries(release: str, window: str) -> dict[str, str]:
    """The PromQL reading the router metrics of ``release`` over ``window`` (e.g. ``1m``)."""
    sel = _sel(release)
    return {
        "requests": f"sum by (side, dye_tag, code) (increase(tinct_router_requests_total{{{sel}}}[{window}]))",
        "fallbacks": f"sum by (dye_tag, reason) (increase(tinct_router_fallbacks_total{{{sel}}}[{window}]))",
        "ttfb": "sum by (side, dye_tag, le) "
        f"(increase(tinct_router_time_to_first_byte_seconds_bucket{{{sel}}}[{window}]))",
    }


def _value(sample: Mapping[str, Any]) -> float:
    return float(sample["value"][1])


def samples_from(results: Mapping[str, list[dict[str, Any]]]) -> Samples:
    """Fold the vectors answered for :func:`queries` into :class:`Samples`."""
    out = Samples()
    for s in results.get("requests", []):
        m, v = s["metric"], _value(s)
        if math.isnan(v):
            continue
        side = out.side(m.get("side", ""), m.get("dye_tag", ""))
        side.served += v
        if str(m.get("code", "")).startswith("5"):
            side.errors += v
    for s in results.get("fallbacks", []):
        m, v = s["metric"], _value(s)
        if not math.isnan(v):
            key = (m.get("dye_tag", ""), m.get("reason", ""))
            out.fallbacks[key] = out.fallbacks.get(key, 0.0) + v
    for s in results.get("ttfb", []):
        m, v = s["metric"], _value(s)
        if math.isnan(v):
            continue
        le = float(m.get("le", "+Inf"))
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
    requests: float = 0.0  # sent to the candidate: served there or fallen back
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
            g.cand_ok += s.served - s.errors
            _add(g.cand_ttfb, s.ttfb)
        elif side == "stable":
            g.stable_served += s.served
            g.stable_ok += s.served - s.errors
            _add(g.stable_ttfb, s.ttfb)
    for (tag, reason), n in samples.fallbacks.items():
        if wanted is not None and tag not in wanted:
            continue
        g.requests += n
        if reason == "latency_too_high":
            g.slow += n
    if g.slow:
        inf = math.inf
        g.cand_ttfb[inf] = g.cand_ttfb.get(inf, 0.0) + g.slow
    return g


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


def _judge(m: Metric, value: float | None, stable: float | None = None) -> MetricResult:
    thr = _threshold(m)
    if value is None or math.isnan(value):
        return MetricResult(name=m.name, threshold=thr, verdict="Inconclusive", message="no data")
    msgs = []
    if m.min is not None and value < m.min:
        msgs.append(f"{value:.4g} < {m.min:g}")
    if m.max is not None and value > m.max:
        msgs.append(f"{value:.4g} > {m.max:g}")
    if m.max_ms is not None and value > m.max_ms:
        msgs.append(f"{value:.4g} ms > {m.max_ms:g} ms")
    verdict: Verdict = "Fail" if msgs else "Pass"
    if m.max_stable_delta is not None:
        if stable is None or math.isnan(stable):
            if verdict == "Pass":
                verdict = "Inconclusive"
            msgs.append("no stable data to compare with")
        else:
            worse = stable - value if m.name == "success-rate" else value - stable
            if worse > m.max_stable_delta:
                verdict = "Fail"
                msgs.append(f"{worse:.4g} worse than stable ({stable:.4g})")
    return MetricResult(
        name=m.name,
        value=value,
        threshold=thr,
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


def _builtin(m: Metric, g: _Group, cutoff_ms: float | None = None) -> MetricResult:
    if m.name == "success-rate":
        value = 100.0 * g.cand_ok / g.requests if g.requests else None
        stable = 100.0 * g.stable_ok / g.stable_served if g.stable_served else None
        return _judge(m, value, stable)
    q = quantile(0.95, g.cand_ttfb)
    sq = quantile(0.95, g.stable_ttfb)
    value = None if q is None else q * 1000.0
    if g.slow and cutoff_ms is not None and _beyond_buckets(0.95, g.cand_ttfb):
        # The p95 request was cut off by the router's latency limit: it took longer than that.
        value = max(value or 0.0, cutoff_ms)
        if m.max_ms is not None and value >= m.max_ms:
            return MetricResult(
                name=m.name,
                value=value,
                threshold=_threshold(m),
                verdict="Fail",
                message=f"p95 > {cutoff_ms:g} ms: requests fell back at the latency limit",
            )
    return _judge(m, value, None if sq is None else sq * 1000.0)


def _combine(verdicts: Iterable[Verdict]) -> Verdict:
    vs = list(verdicts)
    if "Fail" in vs:
        return "Fail"
    if "Inconclusive" in vs or "Error" in vs or not vs:
        return "Inconclusive"
    return "Pass"


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
        cells: cell name -> dye tags it takes; used with ``spec.perCell``.
        cutoff_ms: the routers' fallback latency limit; a request that fell back for being
            slower took at least this long.
    """
    overall = _group(samples, None)
    results: list[MetricResult] = []
    enough = overall.requests >= spec.min_requests
    for i, m in enumerate(spec.metrics):
        if m.name == "custom":
            got = custom.get(i, "not queried")
            if isinstance(got, str):
                results.append(
                    MetricResult(name=m.name, threshold=_threshold(m), verdict="Inconclusive", message=got)
                )
            else:
                results.append(_judge(m, got))
            continue
        r = _builtin(m, overall, cutoff_ms)
        if not enough and r.verdict != "Inconclusive":
            r = r.model_copy(
                update={
                    "verdict": "Inconclusive",
                    "message": f"{overall.requests:.0f} candidate requests < minRequests {spec.min_requests}",
                }
            )
        results.append(r)
    cell_results: list[CellResult] = []
    if spec.per_cell and cells:
        builtins = [m for m in spec.metrics if m.name != "custom"]
        for name, tags in cells.items():
            g = _group(samples, tags)
            if g.requests < spec.min_requests:
                cell_results.append(CellResult(cell=name, requests=g.requests, verdict="Inconclusive"))
                continue
            ms = [_builtin(m, g, cutoff_ms) for m in builtins]
            cell_results.append(
                CellResult(
                    cell=name, requests=g.requests, verdict=_combine(m.verdict for m in ms), metrics=ms
                )
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
        requests=overall.requests,
        message=message,
        cells=cell_results,
    )


def _inconclusive(spec: Analysis, now: datetime, why: str) -> AnalysisResult:
    metrics = [
        MetricResult(name=m.name, threshold=_threshold(m), verdict="Inconclusive", message=why)
        for m in spec.metrics
    ]
    return AnalysisResult(time=now, verdict="Inconclusive", metrics=metrics, message=f"inconclusive: {why}")


Query = Callable[[str], list[dict[str, Any]]]


def prometheus_query(url: str, timeout: float = 5.0) -> Query:
    """A PromQL instant-query function on ``prometheus-api-client``, without its retries
    (an analysis that cannot reach Prometheus is inconclusive; the next interval tries again)."""
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    prom = PrometheusConnect(url=url, retry=Retry(total=0, raise_on_status=False), timeout=timeout)

    def run(promql: str) -> list[dict[str, Any]]:
        result: Any = prom.custom_query(promql)
        if isinstance(result, dict):  # a scalar or string answer: {"resultType": ..., "result": [t, v]}
            return [{"metric": {}, "value": result.get("result", [0, "NaN"])}]
        if result and isinstance(result[0], (int, float)):  # a bare [time, value] pair
            return [{"metric": {}, "value": result}]
        rows: list[dict[str, Any]] = result
        return rows

    return run


def _custom_value(rows: list[dict[str, Any]]) -> float | str:
    if not rows:
        return "the query returned no data"
    if len(rows) > 1:
        return f"the query returned {len(rows)} series; aggregate it to one number (e.g. sum(...))"
    v = _value(rows[0])
    if math.isnan(v):
        return "the query returned NaN"
    return v


def analyse(
    spec: Analysis,
    release: str,
    now: datetime,
    *,
    query: Query | None = None,
    cells: Mapping[str, list[str]] | None = None,
    cutoff_ms: float | None = None,
) -> AnalysisResult:
    """Query Prometheus for the last ``spec.interval`` of ``release`` and judge it. Blocking."""
    run = query or prometheus_query(spec.prometheus.url or "")
    window = spec.interval
    try:
        builtin = any(m.name != "custom" for m in spec.metrics)
        results = {k: run(q) for k, q in queries(release, window).items()} if builtin else {}
        custom: dict[int, float | str] = {}
        for i, m in enumerate(spec.metrics):
            if m.name == "custom" and m.query:
                promql = m.query.replace("$release", release).replace("$interval", window)
                custom[i] = _custom_value(run(promql))
    except Exception as exc:
        return _inconclusive(spec, now, f"Prometheus at {spec.prometheus.url} failed: {_short(exc)}")
    return evaluate(spec, samples_from(results), custom, now, cells, cutoff_ms)


def _short(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."
