"""The real Prometheus the tests use: scrapes file-discovered targets, answers PromQL,
survives a stop and a start on the same port with its data."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import requests
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tinct_testing.controlplane.prometheus import JOB, Prometheus
from tinct_testing.router_fakes import FakeScheduler, running_router, table
from tinct_testing.wait import eventually


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def exporter() -> Iterator[tuple[str, Gauge]]:
    """A real HTTP /metrics endpoint (prometheus_client) with one gauge, on 127.0.0.1."""
    registry = CollectorRegistry()
    gauge = Gauge("tinct_test_value", "A value the test sets", registry=registry)
    port = _free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{port}", gauge
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def prom(prometheus: Callable[..., Prometheus]) -> Prometheus:
    """A started Prometheus with no targets."""
    return prometheus()


def _value(prom: Prometheus, promql: str) -> float:
    [sample] = prom.wait_for(promql)
    return float(sample["value"][1])


def test_prometheus_is_the_release_built(prometheus_bin: Path) -> None:
    out = subprocess.run([str(prometheus_bin), "--version"], capture_output=True, text=True, check=True)
    assert "prometheus, version 3.16.0" in out.stdout + out.stderr


def test_scrapes_a_target_and_answers_queries(prom: Prometheus, exporter: tuple[str, Gauge]) -> None:
    target, gauge = exporter
    gauge.set(42)
    assert prom.query("tinct_test_value") == []

    t0 = time.monotonic()
    prom.set_targets([target], {"release": "r1"})
    assert _value(prom, 'tinct_test_value{release="r1"}') == 42
    took = time.monotonic() - t0
    print(f"first sample queryable {took:.2f}s after set_targets")
    prom.wait_for_targets([target])
    [up] = prom.query(f'up{{job="{JOB}", instance="{target}"}}')
    assert up["value"][1] == "1"

    gauge.set(7)
    eventually(
        lambda: _value(prom, "tinct_test_value") == 7, timeout=20, what="the changed value scraped again"
    )

    # Targets are replaced, not added to: with none left the series goes stale.
    prom.set_targets([])
    eventually(
        lambda: not prom.query("tinct_test_value"), timeout=20, what="the removed target's series stale"
    )


def test_stop_and_start_keep_the_port_and_the_data(prom: Prometheus, exporter: tuple[str, Gauge]) -> None:
    target, gauge = exporter
    gauge.set(5)
    prom.set_targets([target], wait=True)
    _value(prom, "tinct_test_value")
    url, pid = prom.url, prom.pid
    [series] = prom.query("tinct_test_value[10m]")
    scraped_before = len(series["values"])

    prom.stop()
    assert not prom.alive()
    with pytest.raises(requests.exceptions.ConnectionError):
        prom.query("up")

    prom.start()
    assert (prom.url, prom.alive()) == (url, True)
    assert prom.pid != pid
    # Samples scraped before the outage are still there (same data directory) ...
    [series] = prom.query("tinct_test_value[10m]")
    assert len(series["values"]) >= scraped_before
    # ... and scraping resumes.
    gauge.set(6)
    eventually(lambda: _value(prom, "tinct_test_value") == 6, timeout=20, what="scraping resumed after start")


def test_bad_target_is_refused_with_the_reason(prometheus_bin: Path, tmp_path: Path) -> None:
    prom = Prometheus(prometheus_bin, tmp_path)
    try:
        with pytest.raises(ValueError, match="host:port"):
            prom.set_targets(["http://127.0.0.1:9090/metrics"])
    finally:
        prom.close()


def test_waiting_for_a_dead_target_fails_with_its_scrape_error(prom: Prometheus) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    with pytest.raises(AssertionError, match="connection refused"):
        prom.set_targets([dead], wait=True, timeout=5)


async def test_router_metrics_are_scraped_per_side(
    prom: Prometheus, backends: tuple[FakeScheduler, FakeScheduler]
) -> None:
    """What the release analysis reads: the router's request counter, per scheduler side."""
    v1, v2 = backends
    async with running_router(table(v1.url, v2.url, default_weight=100)) as (base, _):
        async with aiohttp.ClientSession() as http:
            for _ in range(5):
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                    assert r.status == 200
        host_port = base.removeprefix("http://")
        # The router answers scrapes on this event loop: block only a worker thread.
        # A target label named like one of the router's ("release") would win, and the
        # router's would become exported_release; target labels need other names.
        await asyncio.to_thread(prom.set_targets, [host_port], {"fleet": "edge"}, wait=True)
        query = 'sum by (side, scheduler_version) (tinct_router_requests_total{release="chat", fleet="edge"})'
        [sample] = await asyncio.to_thread(prom.wait_for, query)
    assert sample["metric"]["scheduler_version"] == "v2"
    assert float(sample["value"][1]) == 5
    assert len(v2.seen) == 5
