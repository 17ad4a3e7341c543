"""A routing table compiled for the hot path, and the holder that swaps it atomically.

Compiling resolves every (bucket, role, latency) combination to the cell that wins for it,
so classifying a request is a dictionary lookup. Swapping is one reference assignment on
the event loop: a request sees the whole old table or the whole new one, never a mix.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from yarl import URL

from tinct.api import ownership
from tinct.api.ownership import holders
from tinct.api.routing import Endpoint, RoutingCell, RoutingTable, RoutingTableError
from tinct.router.adapter import AdapterRoute

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Route:
    """Where a dye tag goes: the tag string, the cell that won it and that cell's weight."""

    tag: str
    weight: float
    cell: int


@dataclass(frozen=True, slots=True)
class Upstream:
    """One backend as the proxy uses it, with what its requests need precomputed."""

    side: str
    url: URL
    scheduler_version: str
    #: (host, port, TLS): the upstream pool's key.
    origin: tuple[str, int, bool]
    #: ``Host`` header value: the URL's authority as written.
    authority: bytes
    #: Path prefix put before the request target (empty: table URLs have no path).
    prefix: bytes
    version_b: bytes


def _specificity(cell: RoutingCell) -> int:
    m = cell.match
    return sum(1 for v in (m.prompt_length, m.role, m.latency) if v is not None and v != "*")


def _matches(value: str | None, actual: str) -> bool:
    return value is None or value == "*" or value == actual


def salt(text: str) -> hashlib.blake2b:
    """The hash a sticky point starts from (:func:`~tinct.router.choose.salted_point`) for
    the salt ``text``: a release's name for the live split, ``<release>/shadow`` for mirrors."""
    h = hashlib.blake2b(digest_size=8)
    h.update(text.encode() + b"\0")
    return h


def tag_of(bucket: str, role: str, latency: str) -> str:
    """The dye tag string of a classified request."""
    return f"len:{bucket}+role:{role}+latency:{latency}"


class CompiledTable:
    """An immutable, precomputed view of a :class:`RoutingTable`."""

    def __init__(self, table: RoutingTable) -> None:
        self.table = table
        self.version = table.version
        self.release = table.release
        #: The release's namespace as metric labels carry it ("" when the table names none).
        self.namespace = table.namespace or ""
        dye = table.dye
        buckets = dye.prompt_length.buckets
        self.chars_per_token = dye.prompt_length.chars_per_token
        #: (max estimated tokens, name) of every bucket; the last one takes the rest.
        self.bounds: tuple[tuple[float, str], ...] = tuple(
            (float(b.max_tokens) if b.max_tokens is not None else float("inf"), b.name) for b in buckets
        )
        self.role_header = dye.role.header
        self.roles = frozenset(dye.role.values)
        self.role_default = dye.role.default
        self.latency_header = dye.latency.header
        self.latencies = frozenset(dye.latency.values)
        self.latency_default = dye.latency.default
        self.stream_class = dye.latency.stream_class
        self.sticky_header = dye.sticky_key.header
        self.routes: dict[tuple[str, str, str], Route] = {}
        # Most specific cell wins; among equally specific cells, the first listed.
        ranked = sorted(enumerate(table.cells), key=lambda ic: (-_specificity(ic[1]), ic[0]))
        for (_, bucket), role, latency in itertools.product(self.bounds, dye.role.values, dye.latency.values):
            for index, cell in ranked:
                m = cell.match
                if (
                    _matches(m.prompt_length, bucket)
                    and _matches(m.role, role)
                    and _matches(m.latency, latency)
                ):
                    self.routes[(bucket, role, latency)] = Route(
                        tag_of(bucket, role, latency), cell.weight, index
                    )
                    break
        self.stable = _upstream("stable", table.stable)
        self.candidate = _upstream("candidate", table.candidate)
        #: A LoRA adapter candidate: its served name and the pods holding it; None otherwise.
        self.adapter: AdapterRoute[Upstream] | None = (
            AdapterRoute(
                table.candidate.adapter,
                tuple(
                    _upstream("candidate", table.candidate.model_copy(update={"url": url}))
                    for url in table.candidate.addresses
                ),
            )
            if table.candidate.adapter is not None
            else None
        )
        self.latency_limit = table.fallback.latency_ms / 1000.0
        self.idle_timeout = table.fallback.idle_timeout_ms / 1000.0
        self.consecutive_failures = table.fallback.consecutive_failures
        self.cooldown = float(table.fallback.cooldown_seconds)
        self.sticky_base = salt(table.release)
        #: What keeps a candidate's ejection state across table swaps
        #: (:meth:`~tinct.router.proxy.Proxy.health`): built once, read on every candidate request.
        self.health_key = (
            self.namespace,
            self.release,
            str(self.candidate.url),
            self.candidate.scheduler_version,
            self.consecutive_failures,
            self.cooldown,
        )

    @property
    def tags(self) -> list[str]:
        """Every dye tag this table can produce, for metric pre-registration and docs."""
        return [r.tag for r in self.routes.values()]


def _upstream(side: str, ep: Endpoint) -> Upstream:
    url = URL(ep.url)
    assert url.host is not None
    assert url.port is not None
    return Upstream(
        side=side,
        url=url,
        scheduler_version=ep.scheduler_version,
        origin=(url.host, url.port, url.scheme == "https"),
        authority=ep.url.split("://", 1)[1].split("/", 1)[0].encode("ascii"),
        prefix=url.raw_path.rstrip("/").encode("ascii"),
        version_b=ep.scheduler_version.encode("ascii"),
    )


@dataclass(frozen=True)
class _Route:
    """A table in force as :func:`~tinct.api.ownership.holders` sees it."""

    key: str
    created: float
    table: CompiledTable

    @property
    def namespace(self) -> str:
        return self.table.namespace

    @property
    def standing(self) -> bool:
        return self.table.table.standing

    @property
    def models(self) -> list[str]:
        return self.table.table.models

    def since(self, model: str) -> float:
        return ownership.since(self.table.table.claimed, self.created, model)


class TableRefusedError(RoutingTableError):
    """A valid table the holder will not put in force (it goes back in version, or changes
    under a version already seen); rejected like an invalid table."""


def release_identity(table: RoutingTable) -> str:
    """What a table's versions are counted per: its release's uid, else namespace and name."""
    if table.uid:
        return f"uid {table.uid}"
    return f"release {table.namespace or ''}/{table.release}"


@dataclass
class TableHolder:
    """The tables in force, by source key, and which serves which model. Mutated on the loop only.

    Each table names the OpenAI ``model`` values it serves; which table serves a model that
    several name is the rule of :mod:`tinct.api.ownership`: the model belongs to the namespace
    ``owners`` maps it to, else to the namespace of its oldest table (live or standing, by
    ``created``, then key); within that namespace a live table wins over a standing one (the
    route a deleted release left behind) and the older live one keeps it; a table of another
    namespace never gets it. :attr:`current` is the *default* table, picked in the order
    live first, then older, unless
    ``default_release`` names one (``release`` or ``namespace/release``); it takes the paths
    that carry no model and, when it names no models itself, the models no table claims. A
    router with one table that names no models therefore routes everything by it.

    Versions only go forward: the highest version seen is kept per release (its uid, else
    its namespace and name; see :func:`release_identity`), also once its table left force,
    and a table below it, or at it with other content, is refused (:class:`TableRefusedError`).

    ``on_change`` callbacks run after every accepted table, ``on_reject`` after a rejection
    (source, reason); the metrics and readiness hang off them.
    """

    default_release: str | None = None
    #: Model -> the namespace a cluster administrator gave it (``--model-owner``).
    owners: dict[str, str] = field(default_factory=dict)
    current: CompiledTable | None = None
    source: str | None = None
    on_change: list[Callable[[CompiledTable], None]] = field(default_factory=list)
    on_reject: list[Callable[[str, str], None]] = field(default_factory=list)
    #: key -> (created, table)
    tables: dict[str, tuple[float, CompiledTable]] = field(default_factory=dict)
    by_model: dict[str, CompiledTable] = field(default_factory=dict)
    #: :func:`release_identity` -> the table of the highest version seen for it; kept when
    #: its table leaves force, so a deleted and recreated source cannot go back either.
    seen: dict[str, RoutingTable] = field(default_factory=dict)
    #: The source listed every table there is once (the watch's first listing): a router
    #: with no table then has none to wait for, and is ready (it answers 503 until one comes).
    synced: bool = False

    def swap(self, table: RoutingTable, source: str) -> CompiledTable:
        """Put ``table`` in force as the only table.

        Raises:
            TableRefusedError: as :meth:`put` does; the tables in force stay.
        """
        self._check(source, table)
        for key in [k for k in self.tables if k != source]:
            del self.tables[key]
        compiled, _ = self.put(source, table)
        return compiled

    def refusal(self, table: RoutingTable) -> str | None:
        """Why ``table`` would be refused (its version goes back, or it changed under a
        version already seen); None when it may be put in force."""
        prior = self.seen.get(release_identity(table))
        if prior is None or table.version > prior.version:
            return None
        who = f"{table.namespace or ''}/{table.release}" + (f" (uid {table.uid})" if table.uid else "")
        if table.version < prior.version:
            return (
                f"version {table.version} of {who} goes back: version {prior.version} was in force "
                "already; a table's version must grow"
            )
        if table != prior:
            return (
                f"version {table.version} of {who} was in force already with other content; "
                "a changed table needs a new version"
            )
        return None

    def _check(self, key: str, table: RoutingTable) -> None:
        reason = self.refusal(table)
        if reason is not None:
            self.reject(key, reason)
            raise TableRefusedError(key, reason)

    def put(self, key: str, table: RoutingTable, created: float = 0.0) -> tuple[CompiledTable, list[str]]:
        """Put the table of source ``key`` in force (replacing that source's previous one).

        Returns the compiled table and the models it claims that another table keeps.

        Raises:
            TableRefusedError: the table goes back in version, or changed under a version in
                force before (:meth:`refusal`); it is rejected as an invalid table is (through
                :meth:`reject`) and the source's previous table stays.
        """
        self._check(key, table)
        old = self.tables.get(key)
        if old is not None and old[0] == created and old[1].table == table:
            compiled = old[1]  # the same table again (a relist, a reload): nothing changes
            return compiled, [m for m in table.models if self.by_model.get(m) is not compiled]
        compiled = CompiledTable(table)
        identity = release_identity(table)
        prior = self.seen.get(identity)
        if prior is None or table.version > prior.version:
            self.seen[identity] = table
        self.tables[key] = (created, compiled)
        self._index()
        _log.info(
            "routing table in force: release=%s/%s version=%d state=%s step=%d models=%s%s from %s",
            table.namespace or "",
            table.release,
            table.version,
            table.state,
            table.step,
            ",".join(table.models) or "*",
            " (standing)" if table.standing else "",
            key,
        )
        for cb in self.on_change:
            cb(compiled)
        return compiled, [m for m in table.models if self.by_model.get(m) is not compiled]

    def remove(self, key: str) -> None:
        """Take the table of source ``key`` out of force, unless it is the last one."""
        if key in self.tables and len(self.tables) > 1:
            del self.tables[key]
            self._index()

    def _index(self) -> None:
        default: tuple[str, CompiledTable] | None = None
        # Live tables before standing ones, then the older first.
        ranked = sorted(self.tables.items(), key=lambda kv: (kv[1][1].table.standing, kv[1][0], kv[0]))
        for key, (_, t) in ranked:
            if default is None or (self._named_default(t) and not self._named_default(default[1])):
                default = (key, t)
        routes = [_Route(key, created, t) for key, (created, t) in self.tables.items()]
        self.by_model = {m: r.table for m, r in holders(routes, self.owners).items()}
        self.source, self.current = default if default is not None else (None, None)

    def _named_default(self, t: CompiledTable) -> bool:
        """``default_release`` names ``t``: as ``release``, or ``namespace/release``."""
        name = self.default_release
        return name is not None and name in (t.release, f"{t.namespace}/{t.release}")

    def for_model(self, model: object) -> CompiledTable | None:
        """The table that routes requests for ``model``; None: no table serves it."""
        if isinstance(model, str):
            t = self.by_model.get(model)
            if t is not None:
                return t
        d = self.current
        return d if d is not None and not d.table.models else None

    def reject(self, source: str, reason: str) -> None:
        entry = self.tables.get(source)
        kept = f"version {entry[1].version}" if entry else "no table"
        _log.error("routing table from %s rejected (%s stays in force): %s", source, kept, reason)
        for cb in self.on_reject:
            cb(source, reason)


__all__ = [
    "CompiledTable",
    "Route",
    "TableHolder",
    "TableRefusedError",
    "Upstream",
    "release_identity",
    "salt",
    "tag_of",
]
