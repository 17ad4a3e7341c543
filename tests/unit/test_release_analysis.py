"""Analysis verdicts from router metrics, and what an unusable Prometheus answer means.

The Prometheus answers are the JSON shape its HTTP API returns; :func:`analyse` is run
against a real HTTP stand-in (:mod:`prometheus_fakes`) that evaluates tinct's own queries.
How a misbehaving Prometheus is handled is in ``test_release_prometheus.py``.
"""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from tinct.api.v1alpha1.grayrelease import Analysis, AnalysisResult
from tinct.operator.grayrelease.analysis import analyse
from tinct.operator.grayrelease.prometheus import PrometheusTarget
from tinct.operator.grayrelease.samples import Samples, Side, quantile, queries, samples_from
from tinct.operator.grayrelease.verdict import evaluate
from tinct_testing.prometheus_fakes import FakePrometheus, Series, buckets, merged, vec

NOW = datetime(2026, 1, 1, tzinfo=UTC)
A = "len:short+role:user+latency:low"
B = "len:long+role:admin+latency:high"


def spec(**kw: Any) -> Analysis:
    doc: dict[str, Any] = {
        "interval": "30s",
        "failureLimit": 2,
        "metrics": [{"name": "success-rate", "min": 99}, {"name": "latency-p95", "maxMs": 800}],
        "minRequests": 10,
    }
    doc.update(kw)
    return Analysis.model_validate(doc)


FAST = {"0.1": 90.0, "0.25": 100.0, "+Inf": 100.0}


def answers(
    *,
    cand: float = 100,
    cand_5xx: float = 0,
    fallbacks: dict[str, float] | None = None,
    tag: str = A,
    cand_ttfb: dict[str, float] | None = None,
    truncated: dict[str, float] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    reqs = [
        vec({"side": "candidate", "dye_tag": tag, "code": "200"}, cand - cand_5xx),
        vec({"side": "stable", "dye_tag": tag, "code": "200"}, 400),
    ]
    if cand_5xx:
        reqs.append(vec({"side": "candidate", "dye_tag": tag, "code": "503"}, cand_5xx))
    return {
        "requests": reqs,
        "fallbacks": [vec({"dye_tag": tag, "reason": r}, n) for r, n in (fallbacks or {}).items()],
        "truncated": [
            vec({"side": side, "dye_tag": tag, "reason": "idle_timeout"}, n)
            for side, n in (truncated or {}).items()
        ],
        "ttfb": buckets("candidate", tag, cand_ttfb or FAST) + buckets("stable", tag, FAST),
    }


def json_safe(r: AnalysisResult) -> None:
    """Written to status as is: strict JSON, and never a non-finite number."""
    json.dumps(r.model_dump(mode="json", by_alias=True), allow_nan=False)
    for m in [*r.metrics, *(m for c in r.cells for m in c.metrics)]:
        for v in (m.value, m.stable_value):
            assert v is None or math.isfinite(v), m
    for n in [r.requests, *(c.requests for c in r.cells)]:
        assert n is None or math.isfinite(n), r


def test_queries_are_scoped_to_the_namespace_release_and_window() -> None:
    q = queries("team-a", 'chat"x', "45s")
    assert 'tinct_router_requests_total{namespace="team-a",release="chat\\"x"}[45s]' in q["requests"]
    assert 'tinct_router_fallbacks_total{namespace="team-a",' in q["fallbacks"]
    assert 'tinct_router_truncated_responses_total{namespace="team-a",' in q["truncated"]
    assert "sum by (side, dye_tag, le)" in q["ttfb"]


def window_of(namespace: str, *, cand: float = 100, cand_5xx: float = 0) -> list[Series]:
    """Raw series of the release ``chat`` in ``namespace``, as the routers export them."""
    out: list[Series] = []
    for row in answers(cand=cand, cand_5xx=cand_5xx)["requests"]:
        labels = {**row["metric"], "namespace": namespace, "release": "chat"}
        out.append(("tinct_router_requests_total", labels, float(row["value"][1])))
    for row in answers()["ttfb"]:
        labels = {**row["metric"], "namespace": namespace, "release": "chat"}
        out.append(("tinct_router_time_to_first_byte_seconds_bucket", labels, float(row["value"][1])))
    return out


async def test_releases_of_one_name_in_two_namespaces_never_judge_each_other() -> None:
    # chat in team-a is healthy, chat in team-b fails half its requests; one Prometheus has both.
    both = window_of("team-a") + window_of("team-b", cand_5xx=50)
    async with FakePrometheus(both) as prom:
        target = PrometheusTarget("default", prom.url)
        a = await analyse(spec(), "team-a", "chat", NOW, prometheus=target)
        b = await analyse(spec(), "team-b", "chat", NOW, prometheus=target)
        other = await analyse(spec(), "team-c", "chat", NOW, prometheus=target)
    assert (a.verdict, a.requests) == ("Pass", 100)
    assert (b.verdict, b.requests) == ("Fail", 100)
    assert next(m for m in b.metrics if m.name == "success-rate").value == pytest.approx(50.0)
    assert other.verdict == "Inconclusive", "no traffic of its own"


async def test_custom_queries_name_the_release_and_answer_one_finite_number() -> None:
    query = 'sum(rate(errors{namespace="$namespace",release="$release"}[$interval]))'
    asked = 'sum(rate(errors{namespace="team-a",release="chat"}[30s]))'
    s = spec(metrics=[{"name": "custom", "query": query, "max": 0.01}])
    for value, verdict, message in (
        (0.001, "Pass", None),
        (0.5, "Fail", "failed: custom 0.5 > 0.01"),
        (math.inf, "Inconclusive", "inconclusive: custom: the query returned +Inf, not a finite number"),
        (math.nan, "Inconclusive", "inconclusive: custom: the query returned NaN, not a finite number"),
    ):
        async with FakePrometheus(custom={asked: value}) as prom:
            r = await analyse(s, "team-a", "chat", NOW, prometheus=PrometheusTarget("default", prom.url))
        assert (r.verdict, r.message) == (verdict, message)
        json_safe(r)
    async with FakePrometheus() as prom:  # the stand-in refuses other queries with 400 bad_data
        r = await analyse(s, "team-b", "chat", NOW, prometheus=PrometheusTarget("default", prom.url))
    assert (
        r.message
        == 'inconclusive: Prometheus "default" answered HTTP 400 (bad_data) (the query of metrics[0])'
    )


def test_quantile_interpolates_like_prometheus() -> None:
    assert quantile(0.95, {0.1: 90.0, 0.25: 100.0, math.inf: 100.0}) == pytest.approx(0.175)
    assert quantile(0.5, {0.1: 0.0, 1.0: 10.0, math.inf: 10.0}) == pytest.approx(0.55)
    assert quantile(0.95, {0.1: 1.0, math.inf: 10.0}) == pytest.approx(0.1)  # in +Inf: the last finite bound
    assert quantile(0.95, {}) is None
    assert quantile(0.95, {0.1: 0.0, math.inf: 0.0}) is None
    assert quantile(0.95, {math.inf: 5.0}) is None  # nothing but +Inf: no estimate


def test_healthy_candidate_passes() -> None:
    r = evaluate(spec(), samples_from(answers()), {}, NOW)
    assert r.verdict == "Pass"
    assert r.requests == 100
    by = {m.name: m for m in r.metrics}
    assert by["success-rate"].value == pytest.approx(100.0)
    assert by["latency-p95"].value == pytest.approx(175.0)
    assert by["latency-p95"].threshold == "<= 800 ms"


def test_fallbacks_count_against_the_candidate() -> None:
    # 90 served by the candidate, 10 fell back to stable after a 5xx: 90% success.
    r = evaluate(spec(), samples_from(answers(cand=90, fallbacks={"upstream_error": 10})), {}, NOW)
    assert r.verdict == "Fail"
    sr = next(m for m in r.metrics if m.name == "success-rate")
    assert sr.value == pytest.approx(90.0)
    assert sr.message == "90 < 99"
    assert "success-rate 90 < 99" in (r.message or "")


def test_too_slow_fallbacks_fail_latency() -> None:
    half = {"0.1": 45.0, "0.25": 50.0, "+Inf": 50.0}
    samples = samples_from(answers(cand=50, fallbacks={"latency_too_high": 50}, cand_ttfb=half))
    r = evaluate(spec(), samples, {}, NOW, cutoff_ms=800)
    lat = next(m for m in r.metrics if m.name == "latency-p95")
    assert (lat.verdict, lat.value) == ("Fail", 800)
    assert "fell back at the latency limit" in (lat.message or "")
    assert r.verdict == "Fail"
    # Every request fell back: the candidate has no latency histogram at all.
    none_served = samples_from(answers(cand=0, fallbacks={"latency_too_high": 40}, cand_ttfb={}))
    lat = next(
        m for m in evaluate(spec(), none_served, {}, NOW, cutoff_ms=800).metrics if m.name == "latency-p95"
    )
    assert (lat.verdict, lat.value) == ("Fail", 800)
    # A few slow ones beyond the p95 do not fail it.
    few = samples_from(answers(cand=99, fallbacks={"latency_too_high": 1}, cand_ttfb=FAST))
    assert evaluate(spec(), few, {}, NOW, cutoff_ms=800).verdict == "Pass"


def test_too_few_requests_or_no_data_is_inconclusive() -> None:
    few = evaluate(spec(), samples_from(answers(cand=5)), {}, NOW)
    assert few.verdict == "Inconclusive"
    assert "5 candidate requests < minRequests 10" in (few.message or "")
    empty = evaluate(spec(), samples_from({"requests": [], "fallbacks": [], "ttfb": []}), {}, NOW)
    assert empty.verdict == "Inconclusive"
    assert {m.verdict for m in empty.metrics} == {"Inconclusive"}
    nan = samples_from({"requests": [vec({"side": "candidate", "dye_tag": A, "code": "200"}, math.nan)]})
    assert evaluate(spec(), nan, {}, NOW).verdict == "Inconclusive"


def test_custom_metric_thresholds_and_unusable_answers() -> None:
    s = spec(metrics=[{"name": "custom", "query": "sum(rate(x[$interval]))", "max": 0.01}])
    assert evaluate(s, samples_from({}), {0: 0.001}, NOW).verdict == "Pass"
    bad = evaluate(s, samples_from({}), {0: 0.5}, NOW)
    assert (bad.verdict, bad.metrics[0].message) == ("Fail", "0.5 > 0.01")
    none = evaluate(s, samples_from({}), {0: "the query returned no data"}, NOW)
    assert none.verdict == "Inconclusive"
    assert "no data" in (none.message or "")


def test_relative_to_stable() -> None:
    s = spec(metrics=[{"name": "latency-p95", "maxMs": 5000, "maxStableDelta": 100}])
    slow = {"0.1": 0.0, "0.25": 10.0, "1.0": 100.0, "+Inf": 100.0}
    r = evaluate(s, samples_from(answers(cand_ttfb=slow)), {}, NOW)
    m = r.metrics[0]
    assert r.verdict == "Fail"
    assert m.stable_value == pytest.approx(175.0)
    assert m.value is not None
    assert m.value > 900
    assert "worse than stable" in (m.message or "")
    assert evaluate(s, samples_from(answers()), {}, NOW).verdict == "Pass"


def test_per_cell_each_cell_with_traffic_must_pass() -> None:
    s = spec(perCell=True)
    good = answers(tag=A)
    bad = answers(tag=B, cand=50, cand_5xx=25)
    merged = {k: good[k] + bad[k] for k in good}
    cells = {"cell-a": [A], "cell-b": [B], "cell-idle": ["len:medium+role:audit+latency:low"]}
    r = evaluate(s, samples_from(merged), {}, NOW, cells)
    by = {c.cell: c for c in r.cells}
    assert (by["cell-a"].verdict, by["cell-b"].verdict, by["cell-idle"].verdict) == (
        "Pass",
        "Fail",
        "Inconclusive",
    )
    assert by["cell-b"].requests == 50
    assert r.verdict == "Fail"
    assert "cell cell-b failed" in (r.message or "")
    # Only the idle cell is inconclusive: the release still passes.
    ok = evaluate(s, samples_from(good), {}, NOW, {"cell-a": [A], "cell-idle": ["x"]})
    assert ok.verdict == "Pass"


def test_truncated_answers_fail_the_side_that_cut_them() -> None:
    # requests_total counted all 100 candidate answers as 200; 5 were cut after their headers.
    r = evaluate(spec(), samples_from(answers(truncated={"candidate": 5})), {}, NOW)
    sr = next(m for m in r.metrics if m.name == "success-rate")
    assert (sr.verdict, sr.value) == ("Fail", pytest.approx(95.0))
    # Stable's cut answers are stable's failures: the candidate is compared with what users saw.
    s = spec(metrics=[{"name": "success-rate", "min": 90, "maxStableDelta": 1}])
    both = evaluate(s, samples_from(answers(truncated={"candidate": 5, "stable": 20})), {}, NOW)
    (sr,) = both.metrics
    assert (sr.verdict, sr.value, sr.stable_value) == ("Pass", pytest.approx(95.0), pytest.approx(95.0))


def test_ejected_fallbacks_count_neither_for_nor_against_the_candidate() -> None:
    # One slow request ejected the candidate; the 20 requests of its cooldown went to stable
    # untried. Only the 21 the candidate got are judged: 20 of 21 answered.
    s = spec(metrics=[{"name": "success-rate", "min": 90}])
    fb = {"latency_too_high": 1, "ejected": 20}
    r = evaluate(s, samples_from(answers(cand=20, fallbacks=fb)), {}, NOW, cutoff_ms=800)
    assert r.requests == 21
    (sr,) = r.metrics
    assert (sr.verdict, sr.value) == ("Pass", pytest.approx(100 * 20 / 21))
    # They do make up minRequests: the candidate's share was there, and a candidate failing
    # hard is tried only a few times per cooldown. Three tries, all failed, while ejected the
    # rest of the window: a failure, not an inconclusive window.
    hard = evaluate(s, samples_from(answers(cand=0, fallbacks={"upstream_error": 3, "ejected": 20})), {}, NOW)
    assert (hard.verdict, hard.requests, hard.metrics[0].value) == ("Fail", 3, pytest.approx(0.0))
    few = evaluate(s, samples_from(answers(cand=5, fallbacks={"ejected": 2})), {}, NOW)
    assert few.verdict == "Inconclusive"
    assert "7 candidate requests < minRequests 10" in (few.message or "")
    # The other fallbacks still count against it.
    bad = evaluate(s, samples_from(answers(cand=20, fallbacks={"unreachable": 20, "ejected": 20})), {}, NOW)
    assert (bad.verdict, bad.requests, bad.metrics[0].value) == ("Fail", 40, pytest.approx(50.0))


def cell_traffic(
    tag: str, *, cand: int, cand_5xx: int = 0, stable: int, stable_5xx: int = 0, slow: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """One dye tag's window; ``slow``: both sides answer in 1-2.5 s, else within 250 ms."""

    def hist(n: int) -> dict[str, float]:
        if slow:
            return {"0.1": 0, "0.25": 0, "1": 0.1 * n, "2.5": n, "+Inf": n}
        return {"0.1": 0.9 * n, "0.25": n, "1": n, "2.5": n, "+Inf": n}

    def codes(side: str, n: int, bad: int) -> list[dict[str, Any]]:
        return [
            vec({"side": side, "dye_tag": tag, "code": "200"}, n - bad),
            vec({"side": side, "dye_tag": tag, "code": "503"}, bad),
        ]

    return {
        "requests": codes("candidate", cand, cand_5xx) + codes("stable", stable, stable_5xx),
        "ttfb": buckets("candidate", tag, hist(cand)) + buckets("stable", tag, hist(stable)),
    }


def test_stable_delta_compares_cell_by_cell() -> None:
    # Cell A takes 90% candidate, cell B 10%: the candidate serves mostly A, stable mostly B.
    # The candidate is 1 pp worse than stable in both cells; pooled, it looks 14 pp better,
    # because cell B fails more for both sides.
    window = samples_from(
        merged(
            cell_traffic(A, cand=900, cand_5xx=18, stable=100, stable_5xx=1),  # 98% vs 99%
            cell_traffic(B, cand=100, cand_5xx=21, stable=900, stable_5xx=180),  # 79% vs 80%
        )
    )
    cells = {"cell-a": [A], "cell-b": [B]}
    s = spec(metrics=[{"name": "success-rate", "min": 50, "maxStableDelta": 0.5}])
    for per_cell in (False, True):
        for by in (cells, None):  # without cells: dye tag by dye tag
            r = evaluate(s.model_copy(update={"per_cell": per_cell}), window, {}, NOW, by)
            (sr,) = r.metrics
            assert sr.verdict == "Fail", (per_cell, by)
            assert sr.value == pytest.approx(96.1)
            assert sr.stable_value == pytest.approx(97.1), "stable in the candidate's mix of cells"
            assert "1 worse than stable (97.1), over 2 cells" in (sr.message or "")
            json_safe(r)

    # Equal latency in each cell, the candidate serving mostly the slow one: pooled, it reads
    # as far slower than stable; cell by cell it is stable's equal.
    window = samples_from(
        merged(cell_traffic(A, cand=100, stable=1000), cell_traffic(B, cand=900, stable=40, slow=True))
    )
    lat = spec(metrics=[{"name": "latency-p95", "maxMs": 5000, "maxStableDelta": 50}])
    r = evaluate(lat, window, {}, NOW, cells)
    (p95,) = r.metrics
    assert p95.verdict == "Pass", p95.message
    assert p95.value is not None
    assert p95.value > 2000


def test_stable_delta_leaves_out_cells_one_side_lacks() -> None:
    s = spec(metrics=[{"name": "success-rate", "min": 50, "maxStableDelta": 0.5}])
    cells = {"cell-a": [A], "cell-b": [B]}
    # Cell B has candidate traffic only: compared in cell A alone, where the two are equal
    # (cell B's failures still count in the value, against min).
    window = samples_from(
        merged(cell_traffic(A, cand=100, stable=100), cell_traffic(B, cand=100, cand_5xx=50, stable=0))
    )
    (sr,) = evaluate(s, window, {}, NOW, cells).metrics
    assert (sr.verdict, sr.value, sr.stable_value) == ("Pass", pytest.approx(75.0), pytest.approx(100.0))
    # No cell has both sides: no comparison, no verdict.
    apart = samples_from(merged(cell_traffic(A, cand=100, stable=0), cell_traffic(B, cand=0, stable=100)))
    r = evaluate(s, apart, {}, NOW, cells)
    assert r.verdict == "Inconclusive"
    assert "no stable data to compare with" in (r.message or "")


def test_non_finite_values_are_inconclusive() -> None:
    s = spec(metrics=[{"name": "custom", "query": "sum(x)", "max": 1}])
    for bad, written in ((math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN")):
        r = evaluate(s, samples_from({}), {0: bad}, NOW)
        assert r.verdict == "Inconclusive"
        assert r.metrics[0].value is None
        assert f"{written}, not a finite number" in (r.message or "")
        json_safe(r)
    # Prometheus answering an infinity for a built-in query.
    inf = answers()
    inf["requests"].append(vec({"side": "candidate", "dye_tag": A, "code": "200"}, math.inf))
    r = evaluate(spec(), samples_from(inf), {}, NOW)
    assert r.verdict == "Inconclusive"
    assert "Prometheus answered +Inf for requests, not a finite number" in (r.message or "")
    json_safe(r)
    # Finite answers whose sum is not.
    huge = answers(cand=1e308)
    huge["requests"].append(vec({"side": "candidate", "dye_tag": A, "code": "200"}, 1e308))
    r = evaluate(spec(), samples_from(huge), {}, NOW)
    assert r.verdict == "Inconclusive"
    assert "request count is +Inf, not a finite number" in (r.message or "")
    json_safe(r)


HOSTILE = ["0", "1", "-1", "7.5", "1e308", "-1e308", "5e-324", "NaN", "+Inf", "-Inf", "1e-300", "x"]


def _hostile_rows(rng: random.Random, query: str) -> list[dict[str, Any]]:
    labels = {
        "side": ["candidate", "stable", "other"],
        "dye_tag": [A, B, ""],
        "code": ["200", "503", ""],
        "reason": ["ejected", "latency_too_high", "upstream_error", "version_mismatch"],
        "le": ["0.1", "0.25", "1", "+Inf", "-Inf", "NaN", "x", "1e308"],
    }
    wanted = {"requests": ("side", "dye_tag", "code"), "fallbacks": ("dye_tag", "reason")}.get(
        query, ("side", "dye_tag", "le") if query == "ttfb" else ("side", "dye_tag")
    )
    return [
        {"metric": {k: rng.choice(labels[k]) for k in wanted}, "value": [0, rng.choice(HOSTILE)]}
        for _ in range(rng.randrange(8))
    ]


def test_results_are_strict_json_whatever_the_samples() -> None:
    rng = random.Random(20260101)
    metrics: list[dict[str, Any]] = [
        {"name": "success-rate", "min": 99},
        {"name": "success-rate", "min": 50, "maxStableDelta": 1},
        {"name": "latency-p95", "maxMs": 800},
        {"name": "latency-p95", "maxMs": 800, "maxStableDelta": 100},
        {"name": "custom", "query": "sum(x)", "max": 1},
    ]
    for _ in range(400):
        chosen = rng.sample(metrics, rng.randrange(1, len(metrics) + 1))
        s = spec(metrics=chosen, perCell=rng.random() < 0.5, minRequests=rng.choice([0, 10]))
        window = samples_from(
            {q: _hostile_rows(rng, q) for q in ("requests", "fallbacks", "truncated", "ttfb")}
        )
        if rng.random() < 0.3:  # built directly, past samples_from's checks
            bad = float(rng.choice(HOSTILE[:-1]))
            window.sides[("candidate", A)] = Side(
                served=bad, errors=rng.random(), ttfb={0.1: bad, math.inf: bad}
            )
            window.fallbacks[(B, "latency_too_high")] = bad
        custom: dict[int, float | str] = {
            i: float(rng.choice(HOSTILE[:-1])) for i, m in enumerate(chosen) if m["name"] == "custom"
        }
        cells = rng.choice([None, {"a": [A], "b": [B]}, {"both": [A, B]}])
        cutoff = rng.choice([None, 800.0])
        json_safe(evaluate(s, window, custom, NOW, cells, cutoff))
    assert isinstance(Samples(), Samples)
