"""How a router runs (:class:`RouterConfig`) and what its request handlers share (:class:`RouterState`).

The routing itself comes from the table; this is the process's side: where it listens, the
limits it enforces on clients and backends, and where its tables come from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tinct.api.backends import FollowsTables
from tinct.api.ownership import parse_model_owners
from tinct.api.routing import TABLE_LABEL
from tinct.router.metrics import RouterMetrics
from tinct.router.paths import DEFAULT_PASS_THROUGH
from tinct.router.table import TableHolder
from tinct.router.trust import RoleTrust
from tinct.router.upstream import IDLE_TIMEOUT

if TYPE_CHECKING:
    from tinct.router.proxy import Proxy

#: Label selector of routing-table ConfigMaps when none is given.
DEFAULT_SELECTOR = f"{TABLE_LABEL}=true"


@dataclass
class RouterConfig(FollowsTables):
    """How the router runs; the routing itself comes from the table."""

    host: str = "0.0.0.0"
    port: int = 8080
    #: Port of ``/metrics``, ``/healthz`` and ``/readyz``; None: served on ``port`` itself.
    metrics_port: int | None = None
    #: Largest classified request body; larger ones get a 413.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Connect timeout towards either backend (the candidate also has the table's latencyMs).
    connect_timeout: float = 5.0
    #: Seconds until stable's response head must be in (the candidate has the table's
    #: latencyMs); generous, as a non-streamed answer sends its head only once generated.
    upstream_head_timeout: float = 300.0
    #: Idle upstream keep-alive connections a process (each worker) keeps per backend, as
    #: nginx's upstream ``keepalive``: more are closed as they come back to the pool (0: none
    #: is kept). Connections in use are not limited.
    upstream_keepalive: int = 64
    #: Seconds an idle upstream connection is kept: under common backends' own keep-alive
    #: timeouts (:data:`~tinct.router.upstream.IDLE_TIMEOUT`).
    keepalive_timeout: float = IDLE_TIMEOUT
    #: Seconds an idle client connection is kept.
    client_keepalive_timeout: float = 75.0
    #: Seconds a request head may take to arrive whole.
    head_timeout: float = 10.0
    #: Seconds a classified request body may take to arrive whole (a streamed one: the
    #: longest pause between two pieces); the client gets a 408.
    body_timeout: float = 30.0
    #: Seconds a shutdown waits for in-flight requests and streams (Kubernetes' default
    #: termination grace is 30 s: stay under it).
    shutdown_timeout: float = 20.0
    #: Routing-table files (one table each; earlier ones count as older).
    table_files: tuple[Path, ...] = ()
    #: Release whose table takes requests without a model (and, if it names no models, the
    #: models no table claims); default: the oldest table.
    default_release: str | None = None
    watch: bool = False
    namespace: str | None = None
    selector: str = DEFAULT_SELECTOR
    kubeconfig: Path | None = None
    #: The kubeconfig context of the watch; None: ``TINCT_CONTEXT``, else the current one.
    context: str | None = None
    #: ``HOST:PORT=ADDR:PORT``: connect to ADDR:PORT for a backend named HOST:PORT (its Host
    #: header and TLS name stay HOST), as ``curl --resolve`` does, for a router outside the
    #: cluster whose Service names do not resolve.
    resolve: tuple[str, ...] = ()
    #: Peer addresses/CIDRs whose role header is believed; nobody's by default.
    trust_role_from: tuple[str, ...] = ()
    #: Path prefixes (besides the classified paths) passed through to stable; any other
    #: path gets a 404 (:class:`~tinct.router.paths.PassThrough`).
    pass_through_prefixes: tuple[str, ...] = DEFAULT_PASS_THROUGH
    #: Backends a watched table may name besides its release's namespace's Services (host
    #: patterns and address ranges, :mod:`tinct.api.backends`); the operator's list.
    allow_backends: tuple[str, ...] = ()
    #: The cluster's DNS domain: ``<service>.<namespace>.svc.<cluster_domain>`` is a Service.
    cluster_domain: str = "cluster.local"
    #: ``MODEL=NAMESPACE``: the namespace a model belongs to whichever routed it first.
    model_owners: tuple[str, ...] = ()
    #: Worker processes accepting on ``port`` (``SO_REUSEPORT``); 1: this process serves alone.
    workers: int = 1
    #: Listen with ``SO_REUSEPORT``, sharing ``port`` with the other workers of one router.
    reuse_port: bool = False
    #: A worker's private Unix socket for ``/metrics``, ``/healthz`` and ``/readyz``, which
    #: its parent reads to sum the workers' metrics and to know they are ready.
    metrics_socket: Path | None = None
    #: Post Kubernetes Events about routing tables (one worker of a router does).
    post_events: bool = True
    #: Measure classified answers as they pass: time to first token, inter-token latency,
    #: output tokens, API contract violations (:mod:`tinct.router.tokens`).
    measure_tokens: bool = True
    #: Base URL of ``tinct comparer``, where pairs of mirrored answers are POSTed
    #: (``/v1/pairs`` under it); None: nothing is mirrored (:mod:`tinct.router.shadow`).
    comparer: str | None = None
    #: File holding the comparer's bearer token (re-read when it changes); None: the
    #: ``TINCT_COMPARER_TOKEN`` variable, else no token. Never the token itself: a worker's
    #: configuration is on its command line.
    comparer_token_file: Path | None = None
    #: Pairs a worker queues for the comparer at most; more are dropped and counted.
    comparer_queue: int = 1024
    #: Bytes a worker holds for pairs at most (mirrors in flight reserve their body and
    #: twice the release's maxBytes; queued pairs their size); past it requests are not mirrored.
    shadow_max_held_bytes: int = 64 * 1024 * 1024

    @property
    def owners(self) -> dict[str, str]:
        """Model -> the namespace a cluster administrator gave it."""
        return dict(parse_model_owners(self.model_owners))


@dataclass
class RouterState:
    """Everything the handlers share; one per router."""

    config: RouterConfig
    holder: TableHolder
    metrics: RouterMetrics
    proxy: Proxy | None = None
    role_trust: RoleTrust = field(default_factory=RoleTrust)
    draining: bool = False
    #: Called on SIGHUP: re-read file tables now.
    reloaders: list[Callable[[], None]] = field(default_factory=list)


__all__ = ["DEFAULT_SELECTOR", "RouterConfig", "RouterState"]
