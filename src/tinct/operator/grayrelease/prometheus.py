"""The operator's Prometheus client: bounded instant queries, on the event loop.

The release controller reads Prometheus for every analysis and every check of the table
version the routers serve. A Prometheus that hangs, drips its answer, answers a huge body or
something else than a query result must cost a bounded wait and bounded memory, and must
leave nothing of its answer but numbers in a GrayRelease's status:

- each query has a deadline (:attr:`PrometheusTarget.timeout`) that covers connecting, the
  headers and the whole body, and the queries of one analysis share a total deadline of
  :data:`TOTAL_TIMEOUTS` times that;
- a body is read up to :data:`MAX_BODY` bytes, then refused, and never decompressed;
- the JSON is checked to be an instant vector or scalar of the Prometheus HTTP API;
- redirects are not followed: the operator queries only the URLs it is configured with
  (:func:`resolve`);
- what went wrong is a :class:`PrometheusError`, whose message names the Prometheus and the
  problem (``Prometheus "default" answered HTTP 503``) and never quotes what it answered.

Everything runs as coroutines on the operator's event loop: a hanging Prometheus holds a
coroutine and at most a few connections of its own (:func:`client_session`), not a thread
another release needs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp
from yarl import URL

from tinct.api.v1alpha1.prometheus import PrometheusRef

if TYPE_CHECKING:
    from tinct.operator.settings import OperatorConfig

__all__ = [
    "MAX_BODY",
    "TOTAL_TIMEOUTS",
    "PrometheusError",
    "PrometheusNotAllowed",
    "PrometheusTarget",
    "Query",
    "client_session",
    "querying",
    "resolve",
    "routers_serving",
    "selector",
]

log = logging.getLogger(__name__)

#: The largest response body read; a longer one is refused.
MAX_BODY = 4 * 1024 * 1024
#: An analysis's queries together may take this many times one query's timeout.
TOTAL_TIMEOUTS = 3
#: The name of the operator's default Prometheus (``tinct operator --prometheus-url``).
DEFAULT = "default"
#: Connections to one Prometheus host from a :func:`client_session`.
CONNECTIONS_PER_HOST = 8

#: ``errorType`` values of the Prometheus HTTP API; a message names one only from this list.
_ERROR_TYPES = frozenset(
    {"timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found", "not_acceptable"}
)
_NOT_A_RESULT = "answered something that is not a Prometheus query result"

#: One instant query: PromQL in, the vector's rows out (``{"metric": {...}, "value": [t, "v"]}``).
Query = Callable[[str], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True)
class PrometheusTarget:
    """A Prometheus the operator is configured with, as one analysis queries it."""

    name: str  #: ``default`` or the name given with ``--prometheus NAME=URL``
    url: str  #: base URL, without a trailing ``/``
    timeout: float = 5.0  #: seconds one query may take


class PrometheusError(Exception):
    """A Prometheus that did not answer a usable query result.

    ``str()`` is ``Prometheus "<name>" <problem>``; neither part holds anything the server
    sent but its HTTP status and a known ``errorType``.
    """

    def __init__(self, target: PrometheusTarget, problem: str) -> None:
        super().__init__(f'Prometheus "{target.name}" {problem}')
        self.target = target
        self.problem = problem


class PrometheusNotAllowed(ValueError):  # noqa: N818 - the controller's interface names it so
    """A release names a Prometheus the operator is not configured with (or none, without a
    default). The message says which ones it may name, and how to add another."""

    def __init__(self, field: str, value: str | None, known: list[tuple[str, str]]) -> None:
        self.field = field
        self.value = value
        self.known = known
        if value is None:
            problem = f"{field} names no Prometheus and the operator has no default"
        else:
            problem = f"{field} {value} is not one the operator is configured with"
        choices = ", ".join(f"{name} ({url})" for name, url in known)
        if not known:
            advice = (
                "the operator has none; ask the operator's administrator to configure one with "
                "tinct operator --prometheus-url URL (chart value operator.prometheus.url)"
            )
        elif value is None:
            advice = (
                f"name one of: {choices} in {field}.name, or ask the operator's "
                "administrator to set a default with tinct operator --prometheus-url URL"
            )
        else:
            advice = (
                f"use one of: {choices}, or ask the operator's administrator to add it with "
                "tinct operator --prometheus NAME=URL"
            )
        super().__init__(f"{problem}; {advice}")


def _known(config: OperatorConfig) -> list[tuple[str, str]]:
    default = [(DEFAULT, config.prometheus_url)] if config.prometheus_url else []
    return default + list(config.prometheus)


def _url_key(url: str) -> tuple[str, str, int | None, str] | None:
    try:
        u = URL(url.strip())
    except (TypeError, ValueError):
        return None
    if u.user is not None or u.password is not None or u.query_string or u.fragment:
        return None
    return (u.scheme.lower(), (u.host or "").lower(), u.port, u.path.rstrip("/"))


def resolve(
    ref: PrometheusRef, config: OperatorConfig, field: str = "spec.analysis.prometheus"
) -> PrometheusTarget:
    """The configured Prometheus ``ref`` (the release's ``field``) names.

    ``name`` picks a named one (``default`` is the default one); ``url`` must equal one's URL
    (up to a trailing ``/``, case of scheme and host, and an explicit default port); neither
    takes the default.

    Raises:
        PrometheusNotAllowed: the release names a Prometheus the operator does not know, or
            none while the operator has no default.
    """
    known = _known(config)

    def target(name: str, url: str) -> PrometheusTarget:
        return PrometheusTarget(name=name, url=url, timeout=config.prometheus_timeout)

    if ref.name is not None:
        for name, url in known:
            if name == ref.name:
                return target(name, url)
        raise PrometheusNotAllowed(f"{field}.name", ref.name, known)
    if ref.url is not None:
        wanted = _url_key(ref.url)
        for name, url in known:
            if wanted is not None and _url_key(url) == wanted:
                return target(name, url)
        raise PrometheusNotAllowed(f"{field}.url", ref.url, known)
    if config.prometheus_url:
        return target(DEFAULT, config.prometheus_url)
    raise PrometheusNotAllowed(field, None, known)


def selector(**labels: str) -> str:
    """PromQL label matchers ``a="x",b="y"`` for exact values."""
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in labels.items()}
    return ",".join(f'{k}="{v}"' for k, v in escaped.items())


def client_session() -> aiohttp.ClientSession:
    """A session for the operator's queries, to share between analyses; close it when done.

    No total cap on connections, at most :data:`CONNECTIONS_PER_HOST` to one Prometheus: a
    hanging one cannot take the connections another needs. Timeouts are per query
    (:func:`querying`), not the session's. Create it on the running loop.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=CONNECTIONS_PER_HOST),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
        trust_env=False,
    )


@asynccontextmanager
async def querying(
    target: PrometheusTarget,
    *,
    session: aiohttp.ClientSession | None = None,
    at: datetime | None = None,
    total: float | None = None,
) -> AsyncIterator[Query]:
    """A :data:`Query` on ``target`` whose queries share one deadline.

    Args:
        target: the Prometheus.
        session: the session to query through; None: one of its own, closed on exit.
        at: the evaluation time of the instant queries; None: Prometheus's now.
        total: seconds all the queries may take; None: :data:`TOTAL_TIMEOUTS` times the
            target's timeout.

    Each query raises :class:`PrometheusError` when the answer is not a usable result.
    """
    loop = asyncio.get_running_loop()
    total = TOTAL_TIMEOUTS * target.timeout if total is None else total
    deadline = loop.time() + total
    async with AsyncExitStack() as stack:
        s = session if session is not None else await stack.enter_async_context(client_session())

        async def query(promql: str) -> list[dict[str, Any]]:
            left = deadline - loop.time()
            if left < target.timeout:  # the analysis's deadline comes first
                late = f"took over {total:g}s for the analysis's queries"
                if left <= 0:
                    raise PrometheusError(target, late)
                return await _query(s, target, promql, at, left, late)
            return await _query(s, target, promql, at, target.timeout, f"timed out after {target.timeout:g}s")

        yield query


async def _query(
    session: aiohttp.ClientSession,
    target: PrometheusTarget,
    promql: str,
    at: datetime | None,
    budget: float,
    late: str,
) -> list[dict[str, Any]]:
    """One query within ``budget`` seconds; ``late`` says what it means not to be done then."""
    # Prometheus takes durations and times as float seconds too; it stops evaluating at its
    # timeout, so a query this client gave up on does not go on loading it.
    params = {"query": promql, "timeout": f"{max(budget, 0.001):.3f}"}
    if at is not None:
        params["time"] = f"{at.timestamp():.3f}"
    try:
        async with (
            asyncio.timeout(budget),
            session.get(
                f"{target.url}/api/v1/query",
                params=params,
                headers={"Accept": "application/json", "Accept-Encoding": "identity"},
                allow_redirects=False,
                auto_decompress=False,
            ) as resp,
        ):
            if resp.status != 200:
                raise PrometheusError(
                    target, f"answered HTTP {resp.status}{await _error_type(resp, budget / 4)}"
                )
            body = await _read(resp)
            if body is None:
                raise PrometheusError(target, f"answered a body over {MAX_BODY // (1024 * 1024)} MiB")
    except TimeoutError:
        raise PrometheusError(target, late) from None
    except aiohttp.ClientConnectorError as exc:
        raise PrometheusError(target, f"could not be reached ({_why(exc.os_error)})") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        # Never str(exc): aiohttp's messages may quote the status line or headers it got.
        raise PrometheusError(target, f"could not be queried ({type(exc).__name__})") from None
    return _rows(target, body)


def _why(error: OSError | None) -> str:
    """``connection refused``, ``Name or service not known``: the failure, without addresses."""
    if isinstance(error, socket.gaierror) and error.strerror:
        return error.strerror
    if error is not None and error.errno:
        return os.strerror(error.errno).lower()
    return type(error).__name__


async def _read(resp: aiohttp.ClientResponse) -> bytes | None:
    """The body, or None (and the connection closed) when it is over :data:`MAX_BODY`."""
    if resp.content_length is not None and resp.content_length > MAX_BODY:
        resp.close()
        return None
    body = bytearray()
    while chunk := await resp.content.read(64 * 1024):
        body += chunk
        if len(body) > MAX_BODY:
            resp.close()
            return None
    return bytes(body)


async def _error_type(resp: aiohttp.ClientResponse, wait: float) -> str:
    """`` (bad_data)`` when an error answer carries a known ``errorType`` within ``wait``
    seconds, else ``""``: the status is the news, the rest is not worth the deadline."""
    try:
        async with asyncio.timeout(wait):
            body = await _read(resp)
        doc = json.loads(body or b"", parse_constant=_refuse)
    except (TimeoutError, ValueError, RecursionError, aiohttp.ClientError):
        return ""
    kind = doc.get("errorType") if isinstance(doc, dict) else None
    return f" ({kind})" if kind in _ERROR_TYPES else ""


def _refuse(constant: str) -> Any:
    raise ValueError("not JSON")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _sample(v: Any) -> bool:
    """A ``[time, "value"]`` pair with a value Prometheus could have written."""
    if not (isinstance(v, list) and len(v) == 2 and _number(v[0]) and isinstance(v[1], str)):
        return False
    try:
        float(v[1])
    except ValueError:
        return False
    return True


def _rows(target: PrometheusTarget, body: bytes) -> list[dict[str, Any]]:
    """The rows of an instant vector (a scalar as one row without labels), checked by shape."""
    try:
        doc = json.loads(body, parse_constant=_refuse)
    except (ValueError, RecursionError):
        raise PrometheusError(target, _NOT_A_RESULT) from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or doc.get("status") != "success":
        raise PrometheusError(target, _NOT_A_RESULT)
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and _sample(result):
        return [{"metric": {}, "value": result}]
    if kind in ("matrix", "string"):
        raise PrometheusError(
            target, f"answered a {kind} where the query must give an instant vector or scalar"
        )
    if kind != "vector" or not isinstance(result, list):
        raise PrometheusError(target, _NOT_A_RESULT)
    for row in result:
        metric = row.get("metric") if isinstance(row, dict) else None
        if not (
            isinstance(metric, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
            and _sample(row.get("value"))
        ):
            raise PrometheusError(target, _NOT_A_RESULT)
    rows: list[dict[str, Any]] = result
    return rows


#: The gauge each router exports: the routing-table version it serves.
TABLE_VERSION = "tinct_router_table_version"


async def routers_serving(
    prometheus: PrometheusTarget,
    namespace: str,
    release: str,
    *,
    session: aiohttp.ClientSession | None = None,
) -> int | None:
    """The lowest routing-table version any router exports for the release in Prometheus.

    None when no router exports one, or Prometheus does not answer a usable number.
    """
    promql = f"min({TABLE_VERSION}{{{selector(namespace=namespace, release=release)}}})"
    try:
        async with querying(prometheus, session=session, total=prometheus.timeout) as query:
            rows = await query(promql)
    except PrometheusError as exc:
        log.debug("table version of %s/%s unknown: %s", namespace, release, exc)
        return None
    if len(rows) != 1:
        return None
    value = float(rows[0]["value"][1])
    if not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)
