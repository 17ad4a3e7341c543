"""The LLM built-ins: time to first token, inter-token latency, throttling, the API contract (from
the routers' metrics), and queue depth, KV cache, prefix cache (from the engines' own), down to
the PromQL each one sends."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from tinct.api.v1alpha1.grayrelease import Analysis, Backend, MetricResult
from tinct.operator.grayrelease.analysis import analyse
from tinct.operator.grayrelease.engine import FORMS, engine_query, reading_from
from tinct.operator.grayrelease.prometheus import PrometheusTarget
from tinct.operator.grayrelease.samples import queries, samples_from
from tinct.operator.grayrelease.verdict import evaluate
from tinct_testing.prometheus_fakes import FakePrometheus, buckets, merged, vec

NOW = datetime(2026, 1, 1, tzinfo=UTC)
A = "len:short+role:user+latency:low"
B = "len:long+role:admin+latency:high"
FAST = {"0.05": 90.0, "0.1": 100.0, "+Inf": 100.0}  # p95 75 ms
SLOW = {"0.05": 0.0, "0.1": 0.0, "1.0": 10.0, "2.5": 100.0, "+Inf": 100.0}  # p95 2.4 s


def spec(*metrics: dict[str, Any], **kw: Any) -> Analysis:
    return Analysis.model_validate({"interval": "30s", "minRequests": 10, "metrics": list(metrics), **kw})


def window(
    tag: str = A,
    *,
    cand: float = 100,
    stable: float = 400,
    cand_codes: dict[str, float] | None = None,
    stable_codes: dict[str, float] | None = None,
    ttfb: dict[str, float] | None = None,
    ttft: dict[str, float] | None = None,
    itl: dict[str, float] | None = None,
    stable_ttft: dict[str, float] | None = None,
    violations: tuple[float, float] = (0, 0),
    fallbacks: dict[str, float] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """One dye tag's router metrics; codes other than those given are 200s."""

    def codes(side: str, total: float, given: dict[str, float] | None) -> list[dict[str, Any]]:
        given = given or {}
        rows = [vec({"side": side, "dye_tag": tag, "code": c}, n) for c, n in given.items()]
        return [*rows, vec({"side": side, "dye_tag": tag, "code": "200"}, total - sum(given.values()))]

    return {
        "requests": codes("candidate", cand, cand_codes) + codes("stable", stable, stable_codes),
        "fallbacks": [vec({"dye_tag": tag, "reason": r}, n) for r, n in (fallbacks or {}).items()],
        "ttfb": buckets("candidate", tag, ttfb or FAST) + buckets("stable", tag, FAST),
        "ttft": buckets("candidate", tag, ttft or FAST) + buckets("stable", tag, stable_ttft or FAST),
        "itl": buckets("candidate", tag, itl or FAST) + buckets("stable", tag, FAST),
        "violations": [
            vec({"side": "candidate", "dye_tag": tag}, violations[0]),
            vec({"side": "stable", "dye_tag": tag}, violations[1]),
        ],
    }


def by_name(metrics: list[MetricResult]) -> dict[str, MetricResult]:
    return {m.name: m for m in metrics}


def test_a_slow_first_token_behind_fast_bytes_fails_ttft_and_not_latency() -> None:
    s = spec({"name": "latency-p95", "maxMs": 800}, {"name": "ttft-p95", "maxMs": 800})
    r = evaluate(s, samples_from(window(ttfb=FAST, ttft=SLOW)), {}, NOW)
    got = by_name(r.metrics)
    assert (got["latency-p95"].verdict, got["latency-p95"].value) == ("Pass", pytest.approx(75.0))
    assert got["ttft-p95"].verdict == "Fail"
    # Status keeps six significant digits of a measured value (2416.67 ms).
    assert got["ttft-p95"].value == pytest.approx(1000 + 1500 * 85 / 90, rel=1e-5)
    assert r.verdict == "Fail"
    assert "ttft-p95 2417 ms > 800 ms" in (r.message or "")


def test_the_quantile_field_picks_the_quantile_judged() -> None:
    # Half the gaps under 50 ms, the tail up to 2.5 s: the median passes, p99 fails.
    gaps = {"0.05": 60.0, "0.1": 80.0, "2.5": 100.0, "+Inf": 100.0}
    w = samples_from(window(itl=gaps))
    median = evaluate(spec({"name": "itl-p95", "maxMs": 100, "quantile": 0.5}), w, {}, NOW).metrics[0]
    tail = evaluate(spec({"name": "itl-p95", "maxMs": 100, "quantile": 0.99}), w, {}, NOW).metrics[0]
    assert (median.verdict, median.value) == ("Pass", pytest.approx(50 * 50 / 60))
    assert (tail.verdict, tail.value) == ("Fail", pytest.approx(2380.0))
    assert tail.threshold == "<= 100 ms, q0.99"


def test_throttling_is_caught_by_throttle_rate_and_not_by_success_rate() -> None:
    s = spec({"name": "success-rate", "min": 99}, {"name": "throttle-rate", "max": 1})
    r = evaluate(s, samples_from(window(cand_codes={"429": 20})), {}, NOW)
    got = by_name(r.metrics)
    assert (got["success-rate"].verdict, got["success-rate"].value) == ("Pass", pytest.approx(100.0))
    assert (got["throttle-rate"].verdict, got["throttle-rate"].value) == ("Fail", pytest.approx(20.0))
    assert got["throttle-rate"].threshold == "<= 1"


def test_throttle_rate_against_stable_is_taken_cell_by_cell() -> None:
    # Both sides throttle 10% in cell A and 50% in cell B; the candidate serves mostly A, so
    # pooled it looks far better than stable: cell by cell it is stable's equal.
    w = samples_from(
        merged(
            window(A, cand=900, stable=100, cand_codes={"429": 90}, stable_codes={"429": 10}),
            window(B, cand=100, stable=900, cand_codes={"429": 50}, stable_codes={"429": 450}),
        )
    )
    s = spec({"name": "throttle-rate", "max": 50, "maxStableDelta": 1})
    (m,) = evaluate(s, w, {}, NOW, {"a": [A], "b": [B]}).metrics
    assert (m.verdict, m.value, m.stable_value) == ("Pass", pytest.approx(14.0), pytest.approx(14.0))
    worse = samples_from(window(cand=100, cand_codes={"429": 10}, stable_codes={"429": 8}))
    (m,) = evaluate(s, worse, {}, NOW).metrics
    assert m.verdict == "Fail"
    assert "8 worse than stable (2)" in (m.message or "")


def test_contract_violations_count_per_hundred_answers_and_against_stable() -> None:
    s = spec({"name": "contract-violations", "max": 0})
    (m,) = evaluate(s, samples_from(window(violations=(5, 0))), {}, NOW).metrics
    assert (m.verdict, m.value) == ("Fail", pytest.approx(5.0))
    (m,) = evaluate(s, samples_from(window()), {}, NOW).metrics
    assert (m.verdict, m.value) == ("Pass", 0.0)
    rel = spec({"name": "contract-violations", "max": 100, "maxStableDelta": 1})
    (m,) = evaluate(rel, samples_from(window(violations=(5, 20))), {}, NOW).metrics
    assert (m.verdict, m.stable_value) == ("Pass", pytest.approx(5.0)), "stable breaks it as often"


def test_ttft_counts_too_slow_fallbacks_at_the_latency_limit_and_itl_does_not() -> None:
    half = {"0.05": 45.0, "0.1": 50.0, "+Inf": 50.0}
    w = samples_from(window(cand=50, fallbacks={"latency_too_high": 50}, ttft=half, itl=half))
    r = evaluate(
        spec({"name": "ttft-p95", "maxMs": 800}, {"name": "itl-p95", "maxMs": 800}), w, {}, NOW, cutoff_ms=800
    )
    got = by_name(r.metrics)
    assert (got["ttft-p95"].verdict, got["ttft-p95"].value) == ("Fail", 800)
    assert "p95 > 800 ms: requests fell back at the latency limit" in (got["ttft-p95"].message or "")
    assert got["itl-p95"].verdict == "Pass", "no token came from them: no gap to judge"


def test_per_cell_judges_the_new_built_ins_in_every_cell() -> None:
    w = samples_from(merged(window(A), window(B, ttft=SLOW)))
    s = spec({"name": "ttft-p95", "maxMs": 800}, perCell=True)
    r = evaluate(s, w, {}, NOW, {"a": [A], "b": [B]})
    assert {c.cell: c.verdict for c in r.cells} == {"a": "Pass", "b": "Fail"}
    assert r.verdict == "Fail"


def test_queries_ask_only_for_what_the_metrics_read() -> None:
    assert set(queries("ns", "chat", "1m", {"success-rate", "throttle-rate"})) == {
        "requests",
        "fallbacks",
        "truncated",
    }
    q = queries("ns", "chat", "1m", {"ttft-p95", "itl-p95", "contract-violations"})
    assert set(q) == {"requests", "fallbacks", "truncated", "ttft", "itl", "violations"}
    assert "tinct_router_time_to_first_token_seconds_bucket{" in q["ttft"]
    assert "tinct_router_inter_token_latency_seconds_bucket{" in q["itl"]
    assert 'tinct_router_contract_violations_total{namespace="ns",release="chat"}[1m]' in q["violations"]
    assert set(queries("ns", "chat", "1m")) >= {"ttfb", "ttft", "itl", "violations"}


# --- engine metrics -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "engine", "names"),
    [
        ("queue-depth", "vllm", ["vllm:num_requests_waiting"]),
        ("queue-depth", "sglang", ["sglang:num_queue_reqs", "sglang_num_queue_reqs"]),
        ("queue-depth", "tgi", ["tgi_queue_size"]),
        ("kv-cache-usage", "vllm", ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]),
        ("kv-cache-usage", "sglang", ["sglang:token_usage", "sglang_token_usage"]),
        (
            "prefix-cache-hit-rate",
            "vllm",
            ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"],
        ),
        (
            "prefix-cache-hit-rate",
            "sglang",
            ["sglang:cached_tokens_total", "sglang_cached_tokens_total", "sglang:cache_hit_rate", "sglang_cache_hit_rate"],
        ),
    ],
)  # fmt: skip
def test_each_engine_query_tries_every_known_name_in_order(
    metric: str, engine: str, names: list[str]
) -> None:
    promql = engine_query(metric, engine, {"service": 'sched-"v2"', "namespace": "llm"}, "45s")
    assert promql is not None
    forms = promql.split(" or ")
    assert len(forms) == len(names)
    for i, (form, name) in enumerate(zip(forms, names, strict=True)):
        assert f'{name}{{service="sched-\\"v2\\"",namespace="llm"}}[45s]' in form
        assert form.endswith(f', "tinct_series", "{i}", "", "")')
    if metric == "kv-cache-usage":
        assert "100 * avg(avg_over_time(" in forms[0], "engines export a fraction; status shows percent"


def test_an_engine_without_the_metric_has_no_query() -> None:
    assert engine_query("kv-cache-usage", "tgi", {"service": "x"}, "1m") is None
    assert engine_query("prefix-cache-hit-rate", "tgi", {"service": "x"}, "1m") is None
    assert ("queue-depth", "tgi") in FORMS


def test_the_first_form_present_wins_and_is_named() -> None:
    labels = {"service": "sched-v2"}
    both = [vec({"tinct_series": "1"}, 40.0), vec({"tinct_series": "0"}, 30.0)]
    r = reading_from("kv-cache-usage", "vllm", labels, both)
    assert (r.value, r.series) == (30.0, "vllm:kv_cache_usage_perc")
    old = reading_from("kv-cache-usage", "vllm", labels, [vec({"tinct_series": "1"}, 40.0)])
    assert (old.value, old.series) == (40.0, "vllm:gpu_cache_usage_perc")
    none = reading_from("kv-cache-usage", "vllm", labels, [vec({"tinct_series": "7"}, 1.0), vec({}, 2.0)])
    assert none.value is None
    assert none.why == (
        'no series of vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc matching {service="sched-v2"} in the window'
    )
    nan = reading_from("prefix-cache-hit-rate", "vllm", labels, [vec({"tinct_series": "0"}, math.nan)])
    assert nan.value is None
    assert "NaN, not a finite number" in (nan.why or "")


def backend(engine: str | None, service: str) -> Backend:
    doc: dict[str, Any] = {"modelVersion": "m", "service": service, "port": 8000, "schedulerVersion": "v"}
    if engine:
        doc.update(engine=engine, metricsSelector={"service": service})
    return Backend.model_validate(doc)


async def test_engine_metrics_are_read_from_prometheus_and_say_which_series() -> None:
    cand, stable = backend("sglang", "sched-v2"), backend("vllm", "sched-v1")
    metrics = [
        {"name": "queue-depth", "max": 4, "maxStableDelta": 1},
        {"name": "kv-cache-usage", "max": 90},
        {"name": "prefix-cache-hit-rate", "min": 20},
    ]
    queue_c = engine_query("queue-depth", "sglang", {"service": "sched-v2"}, "30s")
    queue_s = engine_query("queue-depth", "vllm", {"service": "sched-v1"}, "30s")
    kv = engine_query("kv-cache-usage", "sglang", {"service": "sched-v2"}, "30s")
    prefix = engine_query("prefix-cache-hit-rate", "sglang", {"service": "sched-v2"}, "30s")
    assert queue_c is not None
    assert queue_s is not None
    assert kv is not None
    assert prefix is not None
    answers = {
        queue_c: {
            "status": "success",
            "data": {"resultType": "vector", "result": [vec({"tinct_series": "1"}, 6.5)]},
        },
        queue_s: {
            "status": "success",
            "data": {"resultType": "vector", "result": [vec({"tinct_series": "0"}, 0.5)]},
        },
        kv: {
            "status": "success",
            "data": {"resultType": "vector", "result": [vec({"tinct_series": "0"}, 55.0)]},
        },
        prefix: {"status": "success", "data": {"resultType": "vector", "result": []}},
    }
    router = window()
    series = []
    for key, name in (
        ("requests", "tinct_router_requests_total"),
        ("fallbacks", "tinct_router_fallbacks_total"),
    ):
        for row in router[key]:
            series.append(
                (name, {**row["metric"], "namespace": "llm", "release": "chat"}, float(row["value"][1]))
            )
    async with FakePrometheus(series, custom=answers) as prom:
        r = await analyse(
            spec(*metrics),
            "llm",
            "chat",
            NOW,
            prometheus=PrometheusTarget("default", prom.url),
            sides={"candidate": cand, "stable": stable},
        )
        asked = [q["query"] for q in prom.queries]
    got = by_name(r.metrics)
    q = got["queue-depth"]
    assert (q.verdict, q.value, q.stable_value, q.series) == ("Fail", 6.5, 0.5, "sglang_num_queue_reqs")
    assert "6.5 > 4" in (q.message or "")
    assert "6 worse than stable (0.5)" in (q.message or "")
    assert (got["kv-cache-usage"].verdict, got["kv-cache-usage"].series) == ("Pass", "sglang:token_usage")
    prefix = got["prefix-cache-hit-rate"]
    assert prefix.verdict == "Inconclusive", "never a pass without data"
    assert prefix.message is not None
    assert "no series of sglang:cached_tokens_total" in prefix.message
    assert not any("ttfb" in a or "time_to_first_byte" in a for a in asked), "only what the metrics need"
    assert sum("sched-v1" in a for a in asked) == 1, "stable's engine read only for maxStableDelta"


async def test_an_engine_without_the_metric_is_inconclusive_with_that_reason() -> None:
    router = window()
    series = [
        (
            "tinct_router_requests_total",
            {**row["metric"], "namespace": "llm", "release": "chat"},
            float(row["value"][1]),
        )
        for row in router["requests"]
    ]
    async with FakePrometheus(series) as prom:
        r = await analyse(
            spec({"name": "kv-cache-usage", "max": 90}, {"name": "success-rate", "min": 99}),
            "llm",
            "chat",
            NOW,
            prometheus=PrometheusTarget("default", prom.url),
            sides={"candidate": backend("tgi", "sched-v2"), "stable": backend(None, "sched-v1")},
        )
    kv = by_name(r.metrics)["kv-cache-usage"]
    assert (kv.verdict, kv.message) == ("Inconclusive", "tgi exports no kv-cache-usage metric")
    assert r.verdict == "Inconclusive"
    assert "kv-cache-usage: tgi exports no kv-cache-usage metric" in (r.message or "")


def test_engine_metrics_with_too_few_requests_are_inconclusive() -> None:
    from tinct.operator.grayrelease.engine import Reading

    s = spec({"name": "queue-depth", "max": 4})
    quiet = samples_from(window(cand=3))
    r = evaluate(
        s, quiet, {}, NOW, engines={0: (Reading(value=0.0, series="vllm:num_requests_waiting"), None)}
    )
    assert r.metrics[0].verdict == "Inconclusive"
    assert "3 candidate requests < minRequests 10" in (r.message or "")
    stable_missing = spec({"name": "queue-depth", "max": 4, "maxStableDelta": 1})
    r = evaluate(
        stable_missing, samples_from(window()), {}, NOW, engines={0: (Reading(value=1.0, series="x"), None)}
    )
    assert r.metrics[0].verdict == "Inconclusive"
    assert "spec.stable names no engine" in (r.metrics[0].message or "")


async def test_without_a_selector_a_side_is_its_namespace_and_service() -> None:
    side = Backend.model_validate(
        {"modelVersion": "m", "service": "sched-v2", "port": 8000, "schedulerVersion": "v", "engine": "tgi"}
    )
    expected = engine_query("queue-depth", "tgi", {"namespace": "llm", "service": "sched-v2"}, "30s")
    assert expected is not None
    answer = {
        "status": "success",
        "data": {"resultType": "vector", "result": [vec({"tinct_series": "0"}, 3.0)]},
    }
    series = [
        (
            "tinct_router_requests_total",
            {**row["metric"], "namespace": "llm", "release": "chat"},
            float(row["value"][1]),
        )
        for row in window()["requests"]
    ]
    async with FakePrometheus(series, custom={expected: answer}) as prom:
        r = await analyse(
            spec({"name": "queue-depth", "max": 4}),
            "llm",
            "chat",
            NOW,
            prometheus=PrometheusTarget("default", prom.url),
            sides={"candidate": side},
        )
    (q,) = r.metrics
    assert (q.verdict, q.value, q.series) == ("Pass", 3.0, "tgi_queue_size")
