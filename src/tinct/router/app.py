"""The router: typed state, request dispatch, lifecycle.

Endpoints:

- ``POST /v1/chat/completions``, ``POST /v1/completions``: the body's ``model`` picks the
  table (:meth:`TableHolder.for_model`), then the request is classified and proxied to the
  side the sticky choice and the fallback rules give. A body that is not a JSON object of
  the endpoint's shape gets a 400, one over ``max_body_bytes`` a 413, a model no table
  serves a 404, all as OpenAI-style JSON errors and without reaching a backend.
- ``GET``/``HEAD`` ``/healthz``: the process serves. ``/readyz``: a routing table is in
  force (or, when following ConfigMaps, the first listing found none) and the router is
  not draining. ``/metrics``: Prometheus text.
- a path under a pass-through prefix (``--pass-through-prefix``, by default ``/v1/``):
  passed to the default table's stable unclassified (request body streamed), dye tag
  ``none``. Any other path gets a 404 and reaches no backend.

Without a table every proxied request gets a 503. The router's own error answers carry a
fixed message and ``X-Request-Id`` (:mod:`tinct.router.errors`).

With a comparer configured, a classified request going to stable may also be mirrored
(:mod:`tinct.router.shadow`): the choice is made here, after the live one, and the mirror
runs beside the live request.

:class:`Router` puts the pieces together: the HTTP/1.1 server (:mod:`tinct.router.server`),
the upstream pool (:mod:`tinct.router.upstream`), the proxy, the table sources and mirroring.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tinct.router.choose import sticky_key, to_candidate
from tinct.router.classify import CLASSIFIED_PATHS, ClassifyError, classify_doc, parse_body
from tinct.router.config import RouterConfig, RouterState
from tinct.router.connection import ServerConnection
from tinct.router.errors import NOT_LOCAL, REQUEST_ID, status_of, with_request_id
from tinct.router.exchange import Exchange
from tinct.router.framing import FramingError
from tinct.router.metrics import RouterMetrics
from tinct.router.paths import PassThrough
from tinct.router.proxy import Proxy
from tinct.router.request import BodyTimeoutError, BodyTooLargeError, Request
from tinct.router.server import HttpServer
from tinct.router.shadow import Shadow, open_shadow
from tinct.router.sources import table_sources
from tinct.router.table import CompiledTable, TableHolder
from tinct.router.trust import RoleTrust
from tinct.router.upstream import UpstreamPool
from tinct.router.wire import RawHeaders, json_response, simple_response, text_response

Answer = tuple[int, RawHeaders, bytes]


def _healthz(st: RouterState) -> Answer:
    return text_response(200, "ok\n")


def _readyz(st: RouterState) -> Answer:
    table = st.holder.current
    if st.draining:
        return text_response(503, "draining\n")
    if table is None:
        if st.holder.synced:
            # Tables are followed and none exists yet (a fresh install): waiting would
            # keep the router out of its Service until the first release, for nothing.
            return text_response(200, "ready: no routing table exists yet\n")
        return text_response(503, "no routing table loaded\n")
    n = len(st.holder.tables)
    if n > 1:
        return text_response(200, f"ready: {n} tables, default {table.release} version {table.version}\n")
    return text_response(200, f"ready: {table.release} table version {table.version}\n")


def _metrics(st: RouterState) -> Answer:
    return simple_response(200, generate_latest(st.metrics.registry), CONTENT_TYPE_LATEST.encode())


_LOCAL: dict[str, Callable[[RouterState], Answer]] = {
    "/healthz": _healthz,
    "/readyz": _readyz,
    "/metrics": _metrics,
}


def _wire_metrics(st: RouterState) -> None:
    def changed(table: CompiledTable) -> None:
        st.metrics.table_version.labels(table.namespace, table.release).set(table.version)
        if st.proxy is not None:
            st.proxy.health(table)

    def rejected(source: str, reason: str) -> None:
        st.metrics.table_rejections.inc()

    st.holder.on_change.append(changed)
    st.holder.on_reject.append(rejected)


class Router:
    """The router process's parts: :meth:`start` to serve, :meth:`stop` to drain and end.

    Args:
        config: listen, limits and table sources (``table_file`` and/or ``watch``).
        holder: share a holder, e.g. to put tables in force from a test; a new one if None.
    """

    def __init__(self, config: RouterConfig, holder: TableHolder | None = None) -> None:
        self.state = RouterState(
            config=config,
            holder=holder or TableHolder(default_release=config.default_release, owners=config.owners),
            metrics=RouterMetrics(),
            role_trust=RoleTrust(config.trust_role_from),
        )
        _wire_metrics(self.state)
        self._server: HttpServer | None = None
        #: Servers of /metrics, /healthz, /readyz apart from the proxy port.
        self._local: list[HttpServer] = []
        #: Whether the proxy port answers /metrics, /healthz, /readyz itself.
        self._local_on_proxy = config.metrics_port is None and config.metrics_socket is None
        self._pool: UpstreamPool | None = None
        #: Mirroring, with ``config.comparer`` (:mod:`tinct.router.shadow`).
        self.shadow: Shadow | None = None
        self._sources = contextlib.AsyncExitStack()
        #: Paths other than the classified ones that go to stable.
        self.pass_through = PassThrough(config.pass_through_prefixes)

    @property
    def port(self) -> int:
        """The port listened on (useful with port 0)."""
        assert self._server is not None
        return self._server.port

    async def start(self) -> None:
        """Open the upstream pool, load the table sources, then listen."""
        st = self.state
        cfg = st.config
        self._pool = UpstreamPool(
            connect_timeout=cfg.connect_timeout,
            keep_per_origin=cfg.upstream_keepalive,
            idle_timeout=cfg.keepalive_timeout,
            resolve=parse_resolve(cfg.resolve),
        )
        st.proxy = Proxy(
            self._pool,
            st.metrics,
            head_timeout=cfg.upstream_head_timeout,
            measure_tokens=cfg.measure_tokens,
        )
        if cfg.comparer is not None:
            self.shadow = open_shadow(cfg, st.metrics.shadow, parse_resolve(cfg.resolve))
        if st.holder.current is not None:
            for cb in st.holder.on_change:
                cb(st.holder.current)
        await self._sources.enter_async_context(
            table_sources(cfg, st.holder, st.reloaders, post_events=cfg.post_events)
        )
        self._server = HttpServer(
            self.handle,
            keepalive_timeout=cfg.client_keepalive_timeout,
            head_timeout=cfg.head_timeout,
            body_timeout=cfg.body_timeout,
        )
        await self._server.start(cfg.host, cfg.port, reuse_port=cfg.reuse_port)
        if cfg.metrics_port is not None:
            local = HttpServer(self.handle_local)
            await local.start(cfg.host, cfg.metrics_port)
            self._local.append(local)
        if cfg.metrics_socket is not None:
            local = HttpServer(self.handle_local)
            await local.start_unix(str(cfg.metrics_socket))
            self._local.append(local)

    async def stop(self) -> None:
        """Drain: not ready, stop listening, let answers in progress finish, close upstreams."""
        st = self.state
        st.draining = True
        if self._server is not None:
            await self._server.shutdown(st.config.shutdown_timeout)
        for local in self._local:
            await local.shutdown(1.0)
        await self._sources.aclose()
        if self.shadow is not None:
            await self.shadow.close()
        if self._pool is not None:
            await self._pool.close()

    async def handle(self, request: Request, conn: ServerConnection) -> None:
        """Answer one request (the server's handler)."""
        st = self.state
        method = request.method
        if (method == "GET" or method == "HEAD") and self._local_on_proxy:
            local = _LOCAL.get(request.path)
            if local is not None:
                conn.respond(local(st))
                return
        started = time.perf_counter()
        table = st.holder.current
        proxy = st.proxy
        classified = method == "POST" and request.path in CLASSIFIED_PATHS
        if not classified and not self.pass_through.allows(request.path):
            detail = f"{method} {request.path!r} is under no pass-through prefix"
            if table is None:
                conn.refuse("not_found", detail)
            else:
                self._refuse(Exchange(conn, request, table, started), "not_found", detail, close=False)
            return
        if table is None or proxy is None:
            conn.refuse("no_routing_table")
            return
        ex = Exchange(conn, request, table, started)
        # One frame fewer for the life of a stream: classification returns before forwarding.
        if classified and not await self._classify(ex):
            return
        mirror = ex.mirror
        if mirror is None:
            await proxy.forward(ex)
            return
        try:
            await proxy.forward(ex)
        finally:
            mirror.stable_ended(False)  # stable gave no answer (the proxy reports one that ended)

    async def handle_local(self, request: Request, conn: ServerConnection) -> None:
        """Answer on the metrics port: ``/metrics``, ``/healthz``, ``/readyz`` only."""
        local = _LOCAL.get(request.path) if request.method in ("GET", "HEAD") else None
        if local is None:
            conn.respond(with_request_id(NOT_LOCAL, request.rid))
        else:
            conn.respond(local(self.state))

    def _refuse(self, ex: Exchange, code: str, detail: str | None = None, *, close: bool = True) -> None:
        """Answer a request the router will not pass on with its own error ``code``, and count it."""
        ex.status = status_of(code)
        self.state.metrics.request(ex)
        if close:
            ex.conn.close_after_response = True
        ex.conn.refuse(code, detail)

    async def _classify(self, ex: Exchange) -> bool:
        """Read and classify the body of ``ex``: its table, tag, body and side filled in. False:
        the request was answered (refused) here."""
        st = self.state
        request = ex.request
        limit = st.config.max_body_bytes
        try:
            body = await request.body.read_all(limit)
        except BodyTooLargeError:
            self._refuse(ex, "request_too_large", f"body over --max-body-bytes {limit}")
            return False
        except BodyTimeoutError as e:
            self._refuse(ex, "request_timeout", str(e))
            return False
        except FramingError as e:  # the body's framing broke midway
            self._refuse(ex, e.code, e.detail)
            return False
        try:
            doc = parse_body(body)
            model = doc.get("model")
            table = st.holder.for_model(model)
            if table is None:
                raise _no_table(model, sorted(st.holder.by_model))
            ex.table = table
            route = classify_doc(
                request.path, doc, request.headers, table, role_trusted=st.role_trust.allows(request.remote)
            )
        except ClassifyError as e:
            ex.status = e.status
            st.metrics.request(ex)
            ex.conn.respond(json_response(e.status, e.body(), [(REQUEST_ID, request.rid)]))
            return False
        weight = route.weight
        ex.body = body
        ex.tag = route.tag
        ex.stream = doc.get("stream") is True
        # The sticky key matters only between 0 and 100 (and may cost a random draw).
        ex.candidate = (
            weight >= 100.0
            if weight <= 0.0 or weight >= 100.0
            else to_candidate(table, weight, sticky_key(request.headers, table))
        )
        shadow = self.shadow
        if shadow is not None and not ex.candidate:
            ex.mirror = shadow.consider(ex, route.cell, doc)
        return True


def parse_resolve(items: Sequence[str]) -> dict[tuple[str, int], tuple[str, int]]:
    """``HOST:PORT=ADDR:PORT`` items as a mapping; ``ValueError`` saying which item is wrong."""
    out: dict[tuple[str, int], tuple[str, int]] = {}
    for item in items:
        name, eq, addr = item.partition("=")
        if not eq:
            raise ValueError(f"--resolve {item!r}: give HOST:PORT=ADDRESS:PORT")
        pairs = []
        for part in (name, addr):
            host, colon, port = part.strip().rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"--resolve {item!r}: give HOST:PORT=ADDRESS:PORT")
            pairs.append((host.strip("[]"), int(port)))
        out[pairs[0]] = pairs[1]
    return out


def _no_table(model: object, served: list[str]) -> ClassifyError:
    """Why no table takes a request naming ``model``, with the models this router serves."""
    listed = ", ".join(served[:20]) + (", ..." if len(served) > 20 else "")
    serves = f"this router serves {listed}" if served else "this router serves no model yet"
    if model is None:
        return ClassifyError(400, "model_required", f'the request names no model: set "model" ({serves})')
    if not isinstance(model, str):
        return ClassifyError(400, "invalid_model", f'"model" must be a string ({serves})')
    shown = model if len(model) <= 100 else model[:100] + "..."
    return ClassifyError(404, "model_not_found", f"the model {shown!r} is not served here ({serves})")


__all__ = ["Router"]
