"""Releases judged by what LLM users feel, on the real API server, operator, routers and Prometheus.

Both sides are emulated engines (``tinct emulator``); Prometheus scrapes the router and both
engines every second. Each candidate is broken in one way an HTTP-level analysis misses: a
slow first token behind fast bytes, a growing queue, throttling, a contract-breaking stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tinct.api.v1alpha1.grayrelease import Analysis, Backend
from tinct.emulator import Behaviour, serving
from tinct.operator.grayrelease.analysis import analyse
from tinct.operator.grayrelease.prometheus import PrometheusTarget
from tinct_testing import release_stack
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.release_cluster import apply, example
from tinct_testing.release_traffic import MEDIUM_AUDIT_LOW, STREAMED, Background
from tinct_testing.wait import eventually_async

pytestmark = pytest.mark.usefixtures("crds")

#: Half of every cell to the candidate at the first step: a window sees plenty of it.
CELLS = [{"match": {}, "weights": [50, 100]}]


class Stack(release_stack.Stack):
    """The router and both engines scraped; releases judged on what LLM users feel."""

    def release(self, metrics: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
        analysis = {
            "interval": "6s",
            "failureLimit": 1,
            "minRequests": 5,
            "prometheus": {"url": self.prometheus.url},
            "metrics": metrics,
        }
        doc = example(analysis=analysis, cells=CELLS, **spec)
        doc["spec"].pop("autoscaling")
        for side, engine in (("stable", self.engines.v1), ("candidate", self.engines.v2)):
            doc["spec"][side].update(
                url=engine.url,
                engine=engine.state.behaviour.engine,
                metricsSelector={"instance": f"127.0.0.1:{engine.port}"},
            )
        return doc

    def rolled_back(self) -> dict[str, Any]:
        """The status once rolled back, with the analysis that did it."""
        return self.in_phase("RolledBack", timeout=240)


@pytest.fixture
def stack(
    cluster: Cluster, namespace: str, tmp_path: Path, prometheus: Callable[..., Prometheus]
) -> Iterator[Stack]:
    behaviour = {"ttft_ms": 5, "itl_ms": 2, "output_tokens": 6, "slots": 64}
    with Stack.running(cluster, namespace, tmp_path, prometheus, scrape_engines=True, **behaviour) as s:
        yield s


def metric(status: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(m for m in status["lastAnalysis"]["metrics"] if m["name"] == name)
    return found


def test_a_slow_first_token_behind_fast_bytes_is_rolled_back_by_ttft_while_latency_passes(
    stack: Stack,
) -> None:
    # The head and the role's event come at once; the first token 1.2 s later.
    stack.engines.set(stack.engines.v2, ttft_ms=1200)
    with ExitStack() as load:
        load.enter_context(stack.operator())
        clients = [load.enter_context(Background(stack.router.port, [STREAMED])) for _ in range(3)]
        metrics = [{"name": "latency-p95", "maxMs": 800}, {"name": "ttft-p95", "maxMs": 800}]
        apply(stack.cluster, stack.ns, stack.release(metrics))
        st = stack.rolled_back()
    assert sum(c.answered.get(("v2", "-"), 0) for c in clients) > 0, "the candidate answered, no fallback"
    latency, ttft = metric(st, "latency-p95"), metric(st, "ttft-p95")
    assert latency["verdict"] == "Pass", latency
    assert latency["value"] < 800
    assert ttft["verdict"] == "Fail", ttft
    assert ttft["value"] >= 1000
    assert "ttft-p95" in st["message"]
    assert "latency-p95" not in st["message"]
    explained = stack.cluster.kubectl("explain", "grayrelease.spec.analysis.metrics.name").stdout
    assert "ttft-p95 (ms, time to first token" in " ".join(explained.split()), (
        "kubectl explain gives unit and source"
    )


def test_a_candidate_whose_queue_grows_is_rolled_back_by_queue_depth(stack: Stack) -> None:
    """One batch slot and slow answers: under concurrent streams, requests wait in the
    candidate's queue. Its engine is an SGLang exporting the ``sglang_`` names, stable a
    vLLM: each side is read under its own engine's names, and status says which it found."""
    stack.engines.set(stack.engines.v2, engine="sglang", alt_names=True, slots=1, ttft_ms=200, itl_ms=20)
    metrics = [
        {"name": "success-rate", "min": 95},
        {"name": "queue-depth", "max": 0.5, "maxStableDelta": 0.5},
    ]
    with ExitStack() as load:
        load.enter_context(stack.operator())
        for _ in range(6):  # six clients at once
            load.enter_context(Background(stack.router.port, [STREAMED], pause=0))
        apply(stack.cluster, stack.ns, stack.release(metrics))
        st = stack.rolled_back()
    sr, queue = metric(st, "success-rate"), metric(st, "queue-depth")
    assert sr["verdict"] == "Pass", sr
    assert queue["verdict"] == "Fail", queue
    assert queue["value"] > 0.5
    assert queue["series"] == "sglang_num_queue_reqs"
    assert queue["stableValue"] == pytest.approx(0.0), "stable's vLLM queue stayed empty"
    assert "queue-depth" in st["message"]


def test_a_throttling_candidate_is_caught_by_throttle_rate_and_not_by_success_rate(stack: Stack) -> None:
    stack.engines.set(stack.engines.v2, throttle_rate=0.5)
    metrics = [{"name": "success-rate", "min": 95}, {"name": "throttle-rate", "max": 5}]
    with stack.operator(), Background(stack.router.port, [MEDIUM_AUDIT_LOW]):
        apply(stack.cluster, stack.ns, stack.release(metrics))
        st = stack.rolled_back()
    sr, throttled = metric(st, "success-rate"), metric(st, "throttle-rate")
    assert (sr["verdict"], sr["value"]) == ("Pass", pytest.approx(100.0)), "a 429 is not a 5xx"
    assert throttled["verdict"] == "Fail", throttled
    assert throttled["value"] == pytest.approx(50.0, abs=15)
    assert "throttle-rate" in st["message"]
    assert "success-rate" not in st["message"]


def test_a_contract_breaking_stream_is_caught_by_contract_violations(stack: Stack) -> None:
    stack.engines.set(stack.engines.v2, contract="sse-no-done")
    metrics = [{"name": "success-rate", "min": 95}, {"name": "contract-violations", "max": 0}]
    with stack.operator(), Background(stack.router.port, [STREAMED]) as bg:
        apply(stack.cluster, stack.ns, stack.release(metrics))
        st = stack.rolled_back()
    assert bg.answered.get(("v2", "-"), 0) > 0, "the client got the candidate's streams whole"
    sr, bad = metric(st, "success-rate"), metric(st, "contract-violations")
    assert sr["verdict"] == "Pass", sr
    assert bad["verdict"] == "Fail", bad
    assert bad["value"] == pytest.approx(100.0), "every stream of the candidate ended without [DONE]"
    bad_lines = [
        ln
        for ln in stack.router.metrics().splitlines()
        if ln.startswith("tinct_router_contract_violations_total{")
    ]
    assert bad_lines, "the router counts what it saw"
    assert all('kind="sse_no_done"' in ln and 'side="candidate"' in ln for ln in bad_lines), bad_lines


ENGINES = [
    ("vllm", False, "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
     "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total"),
    ("vllm", True, "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
     "vllm:gpu_prefix_cache_hits_total / vllm:gpu_prefix_cache_queries_total"),
    ("sglang", False, "sglang:num_queue_reqs", "sglang:token_usage",
     "sglang:cached_tokens_total / sglang:prompt_tokens_total"),
    ("sglang", True, "sglang_num_queue_reqs", "sglang_token_usage",
     "sglang_cached_tokens_total / sglang_prompt_tokens_total"),
    ("tgi", False, "tgi_queue_size", None, None),
]  # fmt: skip


async def _read_until(
    spec: Analysis, side: Backend, prom: Prometheus, done: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The engine metrics of ``side`` (name -> MetricResult), read until ``done`` holds."""
    from datetime import UTC, datetime

    async def read() -> dict[str, Any]:
        r = await analyse(
            spec, "ns", "r", datetime.now(UTC), prometheus=PrometheusTarget("default", prom.url),
            sides={"candidate": side},
        )  # fmt: skip
        got = {m.name: m for m in r.metrics}
        assert done(got), got
        return got

    got: dict[str, Any] = await eventually_async(read, timeout=90, interval=0.5, what=what)
    return got


@pytest.mark.parametrize(("engine", "alt", "queue", "kv", "prefix"), ENGINES, ids=lambda v: str(v))
async def test_engine_metrics_read_every_engine_under_each_of_its_names(
    prometheus: Callable[..., Prometheus],
    engine: str,
    alt: bool,
    queue: str,
    kv: str | None,
    prefix: str | None,
) -> None:
    """The engine queries against a real Prometheus scraping an emulated engine: a queue held
    at two with a KV cache holding the running request's prompt, then a prefix cache finding
    half the prompt tokens of the requests of the window."""
    import aiohttp

    behaviour = Behaviour(engine=engine, alt_names=alt, slots=1, ttft_ms=120_000, kv_capacity_tokens=1000)  # type: ignore[arg-type]
    spec = Analysis.model_validate(
        {
            "interval": "3s",
            "minRequests": 0,
            "metrics": [
                {"name": "queue-depth", "max": 10},
                {"name": "kv-cache-usage", "max": 100},
                {"name": "prefix-cache-hit-rate", "min": 0},
            ],
        }
    )
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 400}]}
    async with serving(behaviour) as emu, aiohttp.ClientSession() as http:
        side = Backend.model_validate(
            {"modelVersion": "m", "service": "s", "port": 1, "schedulerVersion": "v", "engine": engine,
             "metricsSelector": {"instance": f"127.0.0.1:{emu.port}"}}
        )  # fmt: skip
        prom = prometheus()
        await asyncio.to_thread(prom.set_targets, [f"127.0.0.1:{emu.port}"], None, wait=True)

        async def ask() -> None:
            async with http.post(f"{emu.url}/v1/chat/completions", json=body) as r:
                await r.read()

        held = [asyncio.create_task(ask()) for _ in range(3)]  # one runs, two wait
        try:
            loaded = await _read_until(
                spec, side, prom, lambda got: got["queue-depth"].value == 2.0, "a window with two waiting"
            )
        finally:
            for t in held:
                t.cancel()
            await asyncio.gather(*held, return_exceptions=True)
        emu.set(ttft_ms=0, slots=8)

        async def traffic() -> None:
            while True:
                await ask()
                await asyncio.sleep(0.05)

        steady = asyncio.create_task(traffic())
        try:
            if prefix is None:
                cached = await _read_until(spec, side, prom, lambda got: True, "a reading")
            else:
                cached = await _read_until(
                    spec, side, prom, lambda got: got["prefix-cache-hit-rate"].value is not None, "a hit rate"
                )
        finally:
            steady.cancel()
            await asyncio.gather(steady, return_exceptions=True)
    assert loaded["queue-depth"].series == queue
    assert loaded["queue-depth"].verdict == "Pass"
    kv_got, prefix_got = loaded["kv-cache-usage"], cached["prefix-cache-hit-rate"]
    if kv is None:
        assert (kv_got.verdict, kv_got.message) == ("Inconclusive", "tgi exports no kv-cache-usage metric")
    else:
        assert kv_got.series == kv
        assert kv_got.value == pytest.approx(10.0), "100 prompt tokens of 1000, as percent"
    if prefix is None:
        assert (prefix_got.verdict, prefix_got.message) == (
            "Inconclusive",
            "tgi exports no prefix-cache-hit-rate metric",
        )
    else:
        assert prefix_got.series == prefix
        assert prefix_got.value == pytest.approx(50.0), "the emulator finds half the prompt tokens"
