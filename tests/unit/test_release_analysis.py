"""Analysis verdicts from router metrics, and what an unusable Prometheus answer means.

The Prometheus answers are the JSON shape its HTTP API returns; the failure cases use real
HTTP: a closed port and a server answering 503.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from router_fakes import free_port
from tinct.api.v1alpha1.grayrelease import Analysis
from tinct.operator.release.analysis import analyse, evaluate, quantile, queries, samples_from

NOW = datetime(2026, 1, 1, tzinfo=UTC)
A = "len:short+role:user+latency:low"
B = "len:long+role:admin+latency:high"


def spec(**kw: Any) -> Analysis:
    doc: dict[str, Any] = {
        "interval": "30s",
        "failureLimit": 2,
        "prometheus": {"url": "http://127.0.0.1:9"},
        "metrics": [{"name": "success-rate", "min": 99}, {"name": "latency-p95", "maxMs": 800}],
        "minRequests": 10,
    }
    doc.update(kw)
    return Analysis.model_validate(doc)


def vec(metric: dict[str, str], value: float) -> dict[str, Any]:
    return {"metric": metric, "value": [1700000000.0, str(value)]}


def ttfb(side: str, tag: str, counts: dict[str, float]) -> list[dict[str, Any]]:
    return [vec({"side": side, "dye_tag": tag, "le": le}, n) for le, n in counts.items()]


FAST = {"0.1": 90.0, "0.25": 100.0, "+Inf": 100.0}


def answers(
    *,
    cand: float = 100,
    cand_5xx: float = 0,
    fallbacks: dict[str, float] | None = None,
    tag: str = A,
    cand_ttfb: dict[str, float] | None = None,
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
        "ttfb": ttfb("candidate", tag, cand_ttfb or FAST) + ttfb("stable", tag, FAST),
    }


def test_queries_are_scoped_to_the_release_and_window() -> None:
    q = queries('chat"x', "45s")
    assert 'tinct_router_requests_total{release="chat\\"x"}[45s]' in q["requests"]
    assert "tinct_router_fallbacks_total" in q["fallbacks"]
    assert "sum by (side, dye_tag, le)" in q["ttfb"]


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


@pytest.fixture
def failing_prometheus() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status":"error","error":"overloaded"}'
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_prometheus_answering_5xx_is_inconclusive(failing_prometheus: str) -> None:
    r = analyse(spec(prometheus={"url": failing_prometheus}), "chat", NOW)
    assert r.verdict == "Inconclusive"
    assert "503" in (r.message or "")
    assert {m.verdict for m in r.metrics} == {"Inconclusive"}


def test_unreachable_prometheus_is_inconclusive() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = analyse(spec(prometheus={"url": url}), "chat", NOW)
    assert r.verdict == "Inconclusive"
    assert f"Prometheus at {url} failed" in (r.message or "")
