"""The router's aiohttp application: routes, typed state, lifecycle.

Endpoints:

- ``POST /v1/chat/completions``, ``POST /v1/completions``: classified, then proxied to the
  side the sticky choice and the fallback rules give. A body that is not a JSON object of
  the endpoint's shape gets a 400, one over ``max_body_bytes`` a 413, both as OpenAI-style
  JSON errors and without reaching a backend.
- ``/healthz``: the process serves. ``/readyz``: a routing table is in force and the router
  is not draining. ``/metrics``: Prometheus text.
- anything else: passed to stable unclassified (request body streamed), dye tag ``none``.

Without a table every proxied request gets a 503.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tinct.router.choose import sticky_key, to_candidate
from tinct.router.classify import CHAT_PATH, COMPLETIONS_PATH, ClassifyError, classify
from tinct.router.metrics import UNCLASSIFIED, RouterMetrics
from tinct.router.proxy import SKIP_AUTO_HEADERS, Proxy, error_response
from tinct.router.table import CompiledTable, TableHolder
from tinct.router.trust import RoleTrust


@dataclass
class RouterConfig:
    """How the router runs; the routing itself comes from the table."""

    host: str = "0.0.0.0"
    port: int = 8080
    #: Largest classified request body; larger ones get a 413.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Connect timeout towards either backend (the candidate also has the table's latencyMs).
    connect_timeout: float = 5.0
    #: Upstream keep-alive connections kept per backend (0: unlimited).
    pool_per_host: int = 0
    keepalive_timeout: float = 60.0
    #: Seconds a shutdown waits for in-flight requests and streams.
    shutdown_timeout: float = 30.0
    table_file: Path | None = None
    watch: bool = False
    namespace: str | None = None
    selector: str = "tinct.io/routing-table=true"
    kubeconfig: Path | None = None
    #: Peer addresses/CIDRs whose role header is believed; nobody's by default.
    trust_role_from: tuple[str, ...] = ()


@dataclass
class RouterState:
    """Everything the handlers share; one per application."""

    config: RouterConfig
    holder: TableHolder
    metrics: RouterMetrics
    proxy: Proxy | None = None
    role_trust: RoleTrust = field(default_factory=RoleTrust)
    draining: bool = False
    #: Called on SIGHUP: re-read file tables now.
    reloaders: list[Callable[[], None]] = field(default_factory=list)


STATE = web.AppKey("tinct_router_state", RouterState)

routes = web.RouteTableDef()


@routes.get("/healthz")
async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


@routes.get("/readyz")
async def _readyz(request: web.Request) -> web.Response:
    st = request.app[STATE]
    table = st.holder.current
    if st.draining:
        return web.Response(status=503, text="draining\n")
    if table is None:
        return web.Response(status=503, text="no routing table loaded\n")
    return web.Response(text=f"ready: {table.release} table version {table.version}\n")


@routes.get("/metrics")
async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _no_table() -> web.Response:
    return error_response(503, "no_routing_table", "the router has no routing table yet")


async def _classified(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    st = request.app[STATE]
    table = st.holder.current
    if table is None or st.proxy is None:
        return _no_table()
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        st.metrics.request(
            table.release, "router", "", UNCLASSIFIED, 413, None, time.perf_counter() - started
        )
        return error_response(
            413, "request_too_large", f"request body over the limit of {st.config.max_body_bytes} bytes"
        )
    try:
        route = classify(
            request.path, body, request.headers, table, role_trusted=st.role_trust.allows(request.remote)
        )
    except ClassifyError as e:
        st.metrics.request(
            table.release, "router", "", UNCLASSIFIED, e.status, None, time.perf_counter() - started
        )
        return web.json_response(e.body(), status=e.status)
    candidate = to_candidate(table, route.weight, sticky_key(request.headers, table))
    return await st.proxy.forward(request, body, table, route.tag, candidate, started)


@routes.post(CHAT_PATH)
async def _chat(request: web.Request) -> web.StreamResponse:
    return await _classified(request)


@routes.post(COMPLETIONS_PATH)
async def _completions(request: web.Request) -> web.StreamResponse:
    return await _classified(request)


@routes.route("*", "/{tail:.*}")
async def _passthrough(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    st = request.app[STATE]
    table = st.holder.current
    if table is None or st.proxy is None:
        return _no_table()
    return await st.proxy.forward(request, None, table, UNCLASSIFIED, False, started)


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    cfg = st.config
    connector = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=cfg.pool_per_host,
        keepalive_timeout=cfg.keepalive_timeout,
        enable_cleanup_closed=False,
    )
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=SKIP_AUTO_HEADERS,
    )
    st.proxy = Proxy(session, st.metrics)
    yield
    await session.close()


def _wire_metrics(st: RouterState) -> None:
    def changed(table: CompiledTable) -> None:
        st.metrics.table_version.labels(table.release).set(table.version)
        if st.proxy is not None:
            st.proxy.health(table)

    def rejected(source: str, reason: str) -> None:
        st.metrics.table_rejections.inc()

    st.holder.on_change.append(changed)
    st.holder.on_reject.append(rejected)


def make_app(config: RouterConfig, holder: TableHolder | None = None) -> web.Application:
    """The router application; tables come from ``holder`` and from the configured sources.

    Args:
        config: listen, limits and table sources (``table_file`` and/or ``watch``).
        holder: share a holder, e.g. to put tables in force from a test; a new one if None.
    """
    app = web.Application(client_max_size=config.max_body_bytes, handler_args={"max_field_size": 16384})
    st = RouterState(
        config=config,
        holder=holder or TableHolder(),
        metrics=RouterMetrics(),
        role_trust=RoleTrust(config.trust_role_from),
    )
    app[STATE] = st
    _wire_metrics(st)
    if st.holder.current is not None:
        for cb in st.holder.on_change:
            cb(st.holder.current)
    app.cleanup_ctx.append(_client_session)
    if config.table_file is not None:
        from tinct.router.sources import file_source

        app.cleanup_ctx.append(file_source)
    if config.watch:
        from tinct.router.watch import watch_source

        app.cleanup_ctx.append(watch_source)
    app.add_routes(routes)
    return app


__all__ = ["STATE", "RouterConfig", "RouterState", "make_app", "routes"]
