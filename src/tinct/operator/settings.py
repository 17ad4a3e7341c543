"""Operator configuration (environment / flags) and the kopf settings tinct runs with.

:class:`OperatorConfig` is one frozen dataclass. Each field that a user sets declares its
environment variable with :func:`_env`; :meth:`OperatorConfig.from_env` reads them all, so
``kopf run -m tinct.operator.modelversion`` works from the environment alone, and
``tinct operator`` starts from the same values and lays its flags over them
(:meth:`OperatorConfig.with_flags`) without touching ``os.environ``. To add a setting: one
field here with its variable, one flag in :mod:`tinct.operator.cli` whose ``dest`` is the
field's name.

===============================  =================================================  ============================
variable                         meaning                                            default
===============================  =================================================  ============================
``TINCT_LINEAGE_ROOT``           root URI of the lineage tables (dir or ``s3://``)  ``/var/lib/tinct/lineage``
``TINCT_LINEAGE_SINGLE_WRITER``  ``true``: one replica writes the lineage tables,   ``false``: a store without
                                 so a store without conditional writes is accepted  them is refused at start
``TINCT_HASH_WORKERS``           threads hashing/validating artifacts               ``4``
``TINCT_S3_ENDPOINT``            S3 endpoint override (else ``AWS_ENDPOINT_URL``)   unset
``TINCT_ONNX_PARSE_LIMIT``       ONNX files up to this many bytes are fully parsed  ``67108864``
``TINCT_PROGRESS_INTERVAL``      seconds between progress updates in status         ``2``
``TINCT_PEERING``                kopf peering name for leader election              unset (standalone)
``TINCT_ARTIFACT_ROOTS``         ``:``-separated directories ``file://`` may read   unset (``file://`` refused)
``TINCT_METRICS_PORT``           port of the operator's Prometheus metrics          ``0`` (not served)
``TINCT_RELEASE_TICK``           seconds between GrayRelease precondition checks    ``5``
``TINCT_CLUSTER_DOMAIN``         DNS suffix of Services in routing tables           ``cluster.local``
``TINCT_ALLOW_BACKENDS``         hosts (``*.example.com``) and address ranges a     unset (a release's own
                                 release's backend URL may name besides its own     namespace's Services only)
                                 namespace's Services, ``,``-separated
``TINCT_MODEL_OWNERS``           ``MODEL=NAMESPACE,...``: the namespace a model     unset (the namespace that
                                 belongs to on the shared routers                   first routed it)
``TINCT_STATUS_KEY_FILE``        a file holding the key GrayRelease statuses are    unset (a key of the
                                 sealed with (``TINCT_STATUS_KEY``: the key itself) process: see below)
``TINCT_PEERING_PRIORITY``       this replica's peering priority (highest acts)     from the start time
``TINCT_PEERING_LIFETIME``       seconds a silent peer counts as alive              ``60``
``TINCT_TABLE_NAMESPACE``        namespace of the routing tables (only the          the operator's own (Pod
                                 operator writes there, the routers read there)     namespace), else ``default``
``TINCT_PROMETHEUS_URL``         the Prometheus analyses read by default            unset
``TINCT_PROMETHEUS``             named ones, ``NAME=URL,NAME=URL``                  unset
``TINCT_PROMETHEUS_TIMEOUT``     seconds one Prometheus query may take              ``5``
``TINCT_CONTEXT``                kubeconfig context (``--context``)                 the current-context
``TINCT_NOTIFIERS``              webhooks, ``NAME=TYPE:URL,...`` (json, slack,       unset
                                 cloudevents; URL may be ``env:VARIABLE``)
``TINCT_NOTIFY_TIMEOUT``         seconds one webhook post may take                  ``5``
``TINCT_NOTIFY_ATTEMPTS``        posts of one notification before giving up         ``6``
``TINCT_NOTIFY_BACKOFF``         seconds before the first retry (then doubling)     ``1``
``TINCT_NOTIFY_BREAK_AFTER``     failed posts in a row that open a webhook's        ``3``
                                 circuit breaker (its notifications are dropped)
``TINCT_NOTIFY_RETRY_AFTER``     seconds an open breaker waits before one post      ``30``
===============================  =================================================  ============================

**Prometheus.** A GrayRelease's analysis reads only a Prometheus of this configuration:
the default one (``TINCT_PROMETHEUS_URL``), or one named here (``TINCT_PROMETHEUS``) that
the release names by ``spec.analysis.prometheus.name`` or by its URL; see
:func:`tinct.operator.grayrelease.prometheus.resolve`. A URL is ``http(s)://host[:port][/path]``:
no credentials (they would show in every message naming the URL), query or fragment.

**Backends.** A release's backends are its own namespace's Services; a ``url`` elsewhere
(another namespace's Service, loopback, an outside host) is refused unless
``TINCT_ALLOW_BACKENDS`` names it (:class:`~tinct.api.backends.BackendPolicy`); give the
routers the same list.

**Status key.** The operator seals every GrayRelease status it writes with this key and acts
only on statuses that verify (:mod:`tinct.operator.grayrelease.seal`); every replica needs
the same key (the chart generates a Secret once and mounts it). Without one, each process
makes its own: after a restart only a status equal to the operator's record of it is
trusted, and one written just before a restart is taken back to that record.

**Peering.** kopf freezes *every* operator that sees a live peer of its own priority, so
replicas started with the same arguments must not share one: unless
``TINCT_PEERING_PRIORITY`` is set, a replica's priority comes from its start time
(:func:`start_priority`), the oldest replica acts and a newer one stands by. A replica that
stops cleanly leaves the peering object at once; one that dies is taken over from when its
last keep-alive is ``TINCT_PEERING_LIFETIME`` seconds old.

kopf keeps its own progress in annotations prefixed ``tinct.io`` rather than in
``status.kopf``: the CRD schemas are structural and the API server would prune it. Its diff
base there is a digest per stanza, not a copy of the object, and neither is written past the
API server's limit on annotations (:mod:`tinct.operator.bookkeeping`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
from yarl import URL

from tinct.api.backends import BackendPolicy, parse_allowed
from tinct.api.ownership import parse_model_owners
from tinct.artifacts.formats import DEFAULT_ONNX_PARSE_LIMIT
from tinct.artifacts.storage import StorageConfig
from tinct.lineage.root import DEFAULT_ROOT, lineage_root
from tinct.text import listed

__all__ = [
    "ANNOTATION_PREFIX",
    "DEFAULT_PROMETHEUS",
    "FINALIZER",
    "OperatorConfig",
    "configure",
    "prometheus_url",
    "start_priority",
]

ANNOTATION_PREFIX = "tinct.io"
FINALIZER = "tinct.io/finalizer"


def _env(variable: str, parse: Callable[[str], Any], default: Any) -> Any:
    """A config field read from ``variable`` (an empty value counts as unset) by ``parse``."""
    return field(default=default, metadata={"env": variable, "parse": parse})


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError("must be true or false")
    return value in ("true", "1", "yes")


def _at_least_one(raw: str) -> int:
    return max(1, int(raw))


def _tick(raw: str) -> float:
    return max(0.1, float(raw))


def _lifetime(raw: str) -> int:
    seconds = int(raw)
    if seconds < 3:
        raise ValueError("must be at least 3 seconds: a live peer would look dead between its keep-alives")
    return seconds


_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace() -> str:
    """The namespace the operator runs in (``POD_NAMESPACE``, else its ServiceAccount's), else ``default``."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        with open(_SA_NAMESPACE) as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"


def _namespace(raw: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", raw):
        raise ValueError("must be a namespace name (a DNS label)")
    return raw


def start_priority(now_ns: int | None = None) -> int:
    """A peering priority from the start time: an older process ranks higher.

    Microseconds before the epoch's 2**53-th one: distinct for replicas started apart, exact
    in any JSON reader of the peering object.
    """
    now = time.time_ns() if now_ns is None else now_ns
    return 2**53 - 1 - now // 1000


def _roots(raw: str | Sequence[str]) -> tuple[str, ...]:
    """Artifact roots from ``--artifact-root`` values or a ``:``-separated variable."""
    items = raw.split(os.pathsep) if isinstance(raw, str) else list(raw)
    roots = tuple(os.path.normpath(r) for r in items if r)
    relative = [r for r in roots if not os.path.isabs(r)]
    if relative:
        raise ValueError(f"artifact roots must be absolute paths, not {', '.join(relative)}")
    return roots


#: A Prometheus name: a DNS label, as ``spec.analysis.prometheus.name`` takes it.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: The name messages give the default Prometheus; not available to a named one.
DEFAULT_PROMETHEUS = "default"


def prometheus_url(raw: str) -> str:
    """``raw`` checked as a Prometheus base URL, without a trailing ``/``."""
    try:
        url = URL(raw.strip())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("a Prometheus URL is http(s)://host[:port][/path]")
    if url.user is not None or url.password is not None:
        raise ValueError("a Prometheus URL may not hold credentials")
    if url.query_string or url.fragment:
        raise ValueError("a Prometheus URL takes no query or fragment")
    return str(url).rstrip("/")


def _prometheus_named(raw: str | Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``NAME=URL`` pairs from ``--prometheus`` values or a ``,``-separated variable."""
    out: dict[str, str] = {}
    for item in listed(raw):
        name, eq, url = item.partition("=")
        name = name.strip()
        if not eq or not url.strip():
            raise ValueError(f"{item!r} is not NAME=URL")
        if not _LABEL.match(name) or len(name) > 63:
            raise ValueError(f"{name!r} is not a Prometheus name (a DNS label: a-z, 0-9, '-')")
        if name == DEFAULT_PROMETHEUS:
            raise ValueError(f"{DEFAULT_PROMETHEUS!r} names the --prometheus-url one (TINCT_PROMETHEUS_URL)")
        if name in out:
            raise ValueError(f"{name!r} is given twice")
        try:
            out[name] = prometheus_url(url)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return tuple(out.items())


def _timeout(raw: str) -> float:
    seconds = float(raw)
    if not (math.isfinite(seconds) and 0 < seconds <= 300):
        raise ValueError("must be more than 0 and at most 300 seconds")
    return seconds


def _notifiers(raw: str | Sequence[str]) -> tuple[Any, ...]:
    from tinct.operator.grayrelease.notify import parse_notifiers

    return parse_notifiers(raw)


def _backoff(raw: str) -> float:
    seconds = float(raw)
    if not (math.isfinite(seconds) and 0 < seconds <= 60):
        raise ValueError("must be more than 0 and at most 60 seconds")
    return seconds


@dataclass(frozen=True)
class OperatorConfig:
    lineage_root: str = _env("TINCT_LINEAGE_ROOT", lineage_root, DEFAULT_ROOT)
    #: One replica writes the lineage tables: the store's conditional writes are not checked.
    lineage_single_writer: bool = _env("TINCT_LINEAGE_SINGLE_WRITER", _flag, False)
    hash_workers: int = _env("TINCT_HASH_WORKERS", _at_least_one, 4)
    onnx_parse_limit: int = _env("TINCT_ONNX_PARSE_LIMIT", int, DEFAULT_ONNX_PARSE_LIMIT)
    progress_interval: float = _env("TINCT_PROGRESS_INTERVAL", float, 2.0)
    peering: str | None = _env("TINCT_PEERING", str, None)
    #: Directories file:// artifacts may be read from; none: file:// is refused.
    artifact_roots: tuple[str, ...] = _env("TINCT_ARTIFACT_ROOTS", _roots, ())
    storage: StorageConfig = field(default_factory=StorageConfig)  # reads its own variables
    metrics_port: int = _env("TINCT_METRICS_PORT", int, 0)
    release_tick: float = _env("TINCT_RELEASE_TICK", _tick, 5.0)
    cluster_domain: str = _env("TINCT_CLUSTER_DOMAIN", str, "cluster.local")
    #: None: :func:`start_priority` when the operator starts.
    peering_priority: int | None = _env("TINCT_PEERING_PRIORITY", int, None)
    peering_lifetime: int = _env("TINCT_PEERING_LIFETIME", _lifetime, 60)
    #: Where routing tables live: writable by the operator alone, read by the routers.
    table_namespace: str = field(
        default_factory=own_namespace, metadata={"env": "TINCT_TABLE_NAMESPACE", "parse": _namespace}
    )
    #: The Prometheus an analysis reads when its release names none; None: no default.
    prometheus_url: str | None = _env("TINCT_PROMETHEUS_URL", prometheus_url, None)
    #: (name, URL) of the other Prometheus servers a release may name.
    prometheus: tuple[tuple[str, str], ...] = _env("TINCT_PROMETHEUS", _prometheus_named, ())
    #: Seconds one Prometheus query may take (the analysis' total is a few times that).
    prometheus_timeout: float = _env("TINCT_PROMETHEUS_TIMEOUT", _timeout, 5.0)
    #: The webhooks releases may name in spec.notify.
    #: (Their URLs may hold secrets: an error about them does not repeat what was given.)
    notifiers: tuple[Any, ...] = field(
        default=(), metadata={"env": "TINCT_NOTIFIERS", "parse": _notifiers, "secret": True}
    )
    notify_timeout: float = _env("TINCT_NOTIFY_TIMEOUT", _timeout, 5.0)
    notify_attempts: int = _env("TINCT_NOTIFY_ATTEMPTS", _at_least_one, 6)
    notify_backoff: float = _env("TINCT_NOTIFY_BACKOFF", _backoff, 1.0)
    #: Backends a release may name besides its namespace's Services (host patterns, ranges).
    allow_backends: tuple[str, ...] = _env("TINCT_ALLOW_BACKENDS", parse_allowed, ())
    #: (model, namespace): the namespace a model belongs to, whichever routed it first.
    model_owners: tuple[tuple[str, str], ...] = _env("TINCT_MODEL_OWNERS", parse_model_owners, ())
    #: A file holding the key statuses are sealed with (the chart mounts a Secret's key).
    status_key_file: str | None = _env("TINCT_STATUS_KEY_FILE", str, None)
    #: The key itself, when not in a file.
    status_key: str | None = field(
        default=None, repr=False, metadata={"env": "TINCT_STATUS_KEY", "parse": str, "secret": True}
    )
    notify_break_after: int = _env("TINCT_NOTIFY_BREAK_AFTER", _at_least_one, 3)
    notify_retry_after: float = _env("TINCT_NOTIFY_RETRY_AFTER", _timeout, 30.0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
        """Defaults overridden by every variable that is set (``os.environ`` by default)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            variable = f.metadata.get("env")
            raw = env.get(variable) if variable else None
            if raw:
                try:
                    values[f.name] = f.metadata["parse"](raw)
                except ValueError as exc:
                    shown = variable if f.metadata.get("secret") else f"{variable}={raw!r}"
                    raise ValueError(f"{shown}: {exc}") from exc
        return cls(**values)

    def seal_key(self) -> bytes | None:
        """The key GrayRelease statuses are sealed with, if one is configured.

        Raises:
            ValueError: the key file cannot be read, or is empty.
        """
        if self.status_key_file:
            try:
                with open(self.status_key_file, "rb") as fh:
                    key = fh.read().strip()
            except OSError as exc:
                raise ValueError(f"TINCT_STATUS_KEY_FILE {self.status_key_file}: {exc.strerror}") from None
            if not key:
                raise ValueError(f"TINCT_STATUS_KEY_FILE {self.status_key_file} is empty")
            return key
        return self.status_key.encode() if self.status_key else None

    @property
    def backends(self) -> BackendPolicy:
        """Which backends a release may name (:mod:`tinct.api.backends`)."""
        return BackendPolicy(self.allow_backends, self.cluster_domain)

    def with_flags(self, flags: Mapping[str, Any]) -> OperatorConfig:
        """This config with each field named in ``flags`` replaced, unless its value is None."""
        names = {f.name: f for f in dataclasses.fields(self)}
        values: dict[str, Any] = {}
        for name, value in flags.items():
            if name in names and value is not None:
                parse = names[name].metadata.get("parse")
                if parse is not None and isinstance(value, str | list):
                    try:
                        value = parse(value)
                    except ValueError as exc:
                        shown = "" if names[name].metadata.get("secret") else f" {value!r}"
                        raise ValueError(f"{name.replace('_', '-')}{shown}: {exc}") from exc
                values[name] = value
        return dataclasses.replace(self, **values)


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Apply tinct's choices to kopf's settings (called from the startup handler)."""
    from tinct.operator.bookkeeping import DigestDiffBaseStorage, GuardedProgressStorage

    settings.persistence.progress_storage = GuardedProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.enabled = True
    settings.posting.level = 20  # logging.INFO: Normal and Warning events reach users
    settings.watching.server_timeout = 300
    # kopf >= 1.40 calls it "queueing"; older releases "batching".
    queueing = getattr(settings, "queueing", None) or settings.batching
    queueing.worker_limit = 256
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
        settings.peering.priority = (
            start_priority() if config.peering_priority is None else config.peering_priority
        )
        settings.peering.lifetime = config.peering_lifetime
        # Cluster-wide or namespaced peering follows the serving mode kopf.run set:
        # a ClusterKopfPeering for the whole cluster, a KopfPeering per served namespace.
