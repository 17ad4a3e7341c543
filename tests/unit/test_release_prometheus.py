"""The operator's Prometheus client against real HTTP servers that misbehave, the choice of
Prometheus from the operator's configuration, and the table version routers serve."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from tinct.api.v1alpha1.grayrelease import Analysis, AnalysisResult, PrometheusRef
from tinct.operator.grayrelease.analysis import analyse
from tinct.operator.grayrelease.prometheus import (
    PrometheusError,
    PrometheusNotAllowed,
    PrometheusTarget,
    client_session,
    querying,
    resolve,
    routers_serving,
)
from tinct.operator.settings import OperatorConfig
from tinct_testing.controlplane.harness import free_port
from tinct_testing.prometheus_fakes import SECRET, FakePrometheus, Series

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TAG = "len:short+role:user+latency:low"
SPEC = Analysis.model_validate(
    {
        "interval": "30s",
        "metrics": [{"name": "success-rate", "min": 99}, {"name": "latency-p95", "maxMs": 800}],
        "minRequests": 10,
    }
)


def target(url: str, timeout: float = 0.5) -> PrometheusTarget:
    return PrometheusTarget(name="default", url=url, timeout=timeout)


def healthy(namespace: str, release: str = "chat", *, failed: float = 0) -> list[Series]:
    """A window of 100 candidate requests (``failed`` of them 503) and 400 stable ones."""
    base = {"namespace": namespace, "release": release, "dye_tag": TAG}
    out: list[Series] = [
        ("tinct_router_requests_total", {**base, "side": "candidate", "code": "200"}, 100 - failed),
        ("tinct_router_requests_total", {**base, "side": "candidate", "code": "503"}, failed),
        ("tinct_router_requests_total", {**base, "side": "stable", "code": "200"}, 400),
    ]
    for side, n in (("candidate", 100.0), ("stable", 400.0)):
        for le, share in (("0.1", 0.9), ("0.25", 1.0), ("+Inf", 1.0)):
            out.append(
                (
                    "tinct_router_time_to_first_byte_seconds_bucket",
                    {**base, "side": side, "le": le},
                    share * n,
                )
            )
    return out


def no_secret(r: AnalysisResult) -> None:
    text = json.dumps(r.model_dump(mode="json", by_alias=True), allow_nan=False)
    assert SECRET not in text
    assert "s3cr3t" not in text


async def test_a_healthy_prometheus_is_queried_at_the_analysis_time() -> None:
    async with FakePrometheus(healthy("llm")) as prom:
        r = await analyse(SPEC, "llm", "chat", NOW, prometheus=target(prom.url))
    assert r.verdict == "Pass", r.message
    assert r.requests == 100
    assert {q["time"] for q in prom.queries} == {f"{NOW.timestamp():.3f}"}
    assert all(float(q["timeout"]) <= 0.5 for q in prom.queries), "Prometheus stops where the client does"


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        ("hang", "timed out after 0.5s"),
        ("drip", "timed out after 0.5s"),  # a byte per 100 ms: the deadline covers the whole body
        ("huge", "answered a body over 4 MiB"),  # Content-Length says so
        ("huge-chunked", "answered a body over 4 MiB"),  # read up to the cap
        ("error", "answered HTTP 503 (unavailable)"),
        ("error-hang", "answered HTTP 503"),  # its body never comes: the status is enough
        ("garbage", "answered something that is not a Prometheus query result"),
    ],
)
async def test_a_misbehaving_prometheus_is_inconclusive_and_never_quoted(mode: str, problem: str) -> None:
    async with FakePrometheus(healthy("llm"), mode=mode) as prom:
        r = await analyse(SPEC, "llm", "chat", NOW, prometheus=target(prom.url))
    assert r.verdict == "Inconclusive"
    assert r.message == f'inconclusive: Prometheus "default" {problem}'
    assert {m.verdict for m in r.metrics} == {"Inconclusive"}
    no_secret(r)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"status":"success"}',
        b'{"status":"success","data":{"resultType":"vector","result":{}}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"many"]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":1},"value":[1,"1"]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[NaN,"1"]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":["1"]}]}}',
        b'{"status":"success","data":{"resultType":"s3cr3t","result":[]}}',
        b'{"status":"error","errorType":"s3cr3t","error":"s3cr3t"}',
        b"[" * 100_000,
        b"\xff\xfe s3cr3t",
    ],
    ids=lambda b: b[:40].decode(errors="replace"),
)
async def test_an_answer_of_the_wrong_shape_is_not_a_result(body: bytes) -> None:
    async with FakePrometheus(mode="body", body=body) as prom:
        r = await analyse(SPEC, "llm", "chat", NOW, prometheus=target(prom.url))
    assert r.verdict == "Inconclusive"
    assert (
        r.message
        == 'inconclusive: Prometheus "default" answered something that is not a Prometheus query result'
    )
    no_secret(r)


async def test_an_unreachable_prometheus_is_inconclusive() -> None:
    r = await analyse(SPEC, "llm", "chat", NOW, prometheus=target(f"http://127.0.0.1:{free_port()}"))
    assert r.verdict == "Inconclusive"
    assert r.message == 'inconclusive: Prometheus "default" could not be reached (connection refused)'


async def test_a_redirect_is_not_followed() -> None:
    from aiohttp import web

    app = web.Application()

    async def elsewhere(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{free_port()}/api/v1/query")

    app.router.add_get("/api/v1/query", elsewhere)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        r = await analyse(SPEC, "llm", "chat", NOW, prometheus=target(f"http://{host}:{port}"))
    finally:
        await runner.cleanup()
    assert r.message == 'inconclusive: Prometheus "default" answered HTTP 302'


async def test_the_queries_of_one_analysis_share_a_total_deadline() -> None:
    async with FakePrometheus(mode="hang") as prom, querying(target(prom.url, timeout=5), total=0.3) as query:
        for _ in range(2):  # cut short by the analysis's deadline, then refused at once
            with pytest.raises(PrometheusError) as info:
                await query("up")
            assert str(info.value) == 'Prometheus "default" took over 0.3s for the analysis\'s queries'


async def test_a_hanging_prometheus_holds_up_no_other_release() -> None:
    # Two releases named chat, in two namespaces, each read from its own Prometheus through
    # one shared session; one Prometheus hangs.
    async with (
        FakePrometheus(mode="hang") as stuck,
        FakePrometheus(healthy("team-b")) as fine,
        client_session() as session,
    ):
        hung = asyncio.create_task(
            analyse(SPEC, "team-a", "chat", NOW, prometheus=target(stuck.url, timeout=3), session=session)
        )
        await asyncio.sleep(0)  # the hung one asks first
        ok = asyncio.create_task(
            analyse(SPEC, "team-b", "chat", NOW, prometheus=target(fine.url, timeout=3), session=session)
        )
        done, _ = await asyncio.wait({hung, ok}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {ok}, "the other release is judged while the stuck Prometheus still hangs"
        assert ok.result().verdict == "Pass"
        assert not hung.done()
        late = await hung
    assert late.message == 'inconclusive: Prometheus "default" timed out after 3s'


def config(**kw: Any) -> OperatorConfig:
    return OperatorConfig.from_env(
        {
            "TINCT_PROMETHEUS_URL": "http://prometheus.monitoring:9090",
            "TINCT_PROMETHEUS": "fleet-b=https://prom.fleet-b:9090/prom",
            "TINCT_PROMETHEUS_TIMEOUT": "2",
            **kw,
        }
    )


def test_resolve_takes_only_configured_prometheus_servers() -> None:
    cfg = config()
    default = PrometheusTarget("default", "http://prometheus.monitoring:9090", 2.0)
    fleet_b = PrometheusTarget("fleet-b", "https://prom.fleet-b:9090/prom", 2.0)
    assert resolve(PrometheusRef(), cfg) == default
    assert resolve(PrometheusRef(name="default"), cfg) == default
    assert resolve(PrometheusRef(name="fleet-b"), cfg) == fleet_b
    # The same URL as configured, written another way.
    assert resolve(PrometheusRef(url="https://Prom.Fleet-B:9090/prom/"), cfg) == fleet_b
    assert resolve(PrometheusRef(url="http://prometheus.monitoring:9090/"), cfg) == default
    assert (
        resolve(
            PrometheusRef(url="http://prometheus.monitoring:80/x"),
            config(TINCT_PROMETHEUS_URL="http://prometheus.monitoring/x"),
        ).url
        == "http://prometheus.monitoring/x"
    )

    with pytest.raises(PrometheusNotAllowed) as info:
        resolve(PrometheusRef(url="http://attacker.example:9090"), cfg)
    assert str(info.value) == (
        "spec.analysis.prometheus.url http://attacker.example:9090 is not one the operator is "
        "configured with; use one of: default (http://prometheus.monitoring:9090), fleet-b "
        "(https://prom.fleet-b:9090/prom), or ask the operator's administrator to add it with "
        "tinct operator --prometheus NAME=URL"
    )
    assert isinstance(info.value, ValueError)
    for ref in (
        PrometheusRef(name="fleet-c"),
        PrometheusRef(url="http://prometheus.monitoring:9090/other"),
        PrometheusRef(url="http://user:pw@prometheus.monitoring:9090"),
    ):
        with pytest.raises(
            PrometheusNotAllowed, match="is not one the operator is configured with; use one of"
        ):
            resolve(ref, cfg)


def test_resolve_without_a_default() -> None:
    named_only = config(TINCT_PROMETHEUS_URL="")
    with pytest.raises(
        PrometheusNotAllowed,
        match=r"names no Prometheus and the operator has no default; name one of: fleet-b",
    ):
        resolve(PrometheusRef(), named_only)
    with pytest.raises(PrometheusNotAllowed, match=r"spec\.analysis\.prometheus\.name default is not one"):
        resolve(PrometheusRef(name="default"), named_only)
    with pytest.raises(PrometheusNotAllowed, match=r"the operator has none; .* --prometheus-url URL"):
        resolve(PrometheusRef(), OperatorConfig())


def versions(namespace: str, release: str, *served: float) -> list[Series]:
    return [
        ("tinct_router_table_version", {"namespace": namespace, "release": release, "instance": f"r{i}"}, v)
        for i, v in enumerate(served)
    ]


async def test_routers_serving_is_the_lowest_version_any_router_exports() -> None:
    series = (
        versions("team-a", "chat", 8, 7, 8) + versions("team-b", "chat", 9) + versions("team-a", "other", 3)
    )
    async with FakePrometheus(series) as prom:
        t = target(prom.url)
        assert await routers_serving(t, "team-a", "chat") == 7
        assert await routers_serving(t, "team-b", "chat") == 9
        assert await routers_serving(t, "team-b", "other") is None, "no router exports it"
    bad = vector_of(float("nan"))
    async with FakePrometheus(custom=bad, mode="ok") as prom:
        assert await routers_serving(target(prom.url), "team-a", "chat") is None
    for mode in ("hang", "error", "garbage"):
        async with FakePrometheus(series, mode=mode) as prom:
            assert await routers_serving(target(prom.url), "team-a", "chat") is None, mode


def vector_of(value: float) -> dict[str, Any]:
    from tinct.operator.grayrelease.prometheus import selector

    promql = f"min(tinct_router_table_version{{{selector(namespace='team-a', release='chat')}}})"
    return {promql: value}
