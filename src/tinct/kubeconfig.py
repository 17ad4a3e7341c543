"""How every tinct process reaches the Kubernetes API: one order, decided at call time.

The order is the one controller-runtime and kubectl users expect:

1. a kubeconfig named explicitly (a ``--kubeconfig`` flag);
2. the kubeconfig(s) ``KUBECONFIG`` names;
3. the Pod's service account, when running in a cluster;
4. ``~/.kube/config``.

The context is the one named with ``--context`` (``TINCT_CONTEXT``), else the kubeconfig's
``current-context``. A command sets both for the whole process with :func:`use`, so every
client it makes — the operator's kopf login, status patches, the routing-table watch — goes
to the same cluster.

The environment is read when a client is made, not when a module is imported (the
``kubernetes`` package freezes ``KUBECONFIG`` at import), so a process that sets it late —
a test, a wrapper — gets what it set.

A kubeconfig that cannot be used raises :class:`KubeconfigError`, whose message says which
file and what is wrong with it, never a stack of library frames.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinct.errors import AboutError

__all__ = [
    "CONTEXT_ENV",
    "Access",
    "KubeconfigError",
    "add_flags",
    "api_client",
    "choose",
    "configuration",
    "contexts",
    "kopf_login",
    "namespace_of",
    "preflight",
    "use",
]

#: Where a Pod's service account token is mounted.
_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: The context to use when no ``--context`` is given; empty: the kubeconfig's current one.
CONTEXT_ENV = "TINCT_CONTEXT"

_chosen: dict[str, str | None] = {"kubeconfig": None, "context": None}


class KubeconfigError(AboutError):
    """A kubeconfig (or the context named in it) that cannot be used (``about``), and why."""


@dataclass(frozen=True)
class Access:
    """The chosen way in: the in-cluster service account, or a kubeconfig file (list)."""

    in_cluster: bool
    kubeconfig: str | None = None  # None when in_cluster
    context: str | None = None  # None: the kubeconfig's current-context

    def __str__(self) -> str:
        if self.in_cluster:
            return "in-cluster service account"
        return f"kubeconfig {self.kubeconfig}" + (f" (context {self.context})" if self.context else "")


def use(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> None:
    """Make ``kubeconfig`` and ``context`` this process's choice (a command's flags)."""
    _chosen["kubeconfig"] = os.fspath(kubeconfig) if kubeconfig is not None else None
    _chosen["context"] = context or None


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and _TOKEN.is_file()


def choose(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> Access:
    """The access to use now, in the order of the module docs."""
    context = context or _chosen["context"] or os.environ.get(CONTEXT_ENV) or None
    explicit = os.fspath(kubeconfig) if kubeconfig is not None else _chosen["kubeconfig"]
    if explicit is not None:
        return Access(in_cluster=False, kubeconfig=explicit, context=context)
    from_env = os.environ.get("KUBECONFIG")
    if from_env:
        return Access(in_cluster=False, kubeconfig=from_env, context=context)
    if _in_cluster() and context is None:
        return Access(in_cluster=True)
    return Access(in_cluster=False, kubeconfig=os.path.expanduser("~/.kube/config"), context=context)


def _files(access: Access) -> list[str]:
    return [os.path.expanduser(p) for p in (access.kubeconfig or "").split(os.pathsep) if p]


def _loader(access: Access) -> Any:
    """The ``kubernetes`` kubeconfig loader of ``access``, or :class:`KubeconfigError`."""
    import yaml
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    where = f"kubeconfig {access.kubeconfig}"
    files = [f for f in _files(access) if os.path.isfile(f)]
    if not files:
        default = access.kubeconfig == os.path.expanduser("~/.kube/config")
        hint = "; give --kubeconfig or set KUBECONFIG" if default else ""
        raise KubeconfigError(where, f"no such file{hint}")
    names: list[str] = []
    current: str | None = None
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh)
        except yaml.YAMLError as exc:
            raise KubeconfigError(f"kubeconfig {path}", f"is not YAML ({_yaml_problem(exc)})") from None
        except OSError as exc:
            raise KubeconfigError(f"kubeconfig {path}", exc.strerror or _first_line(exc)) from None
        if not isinstance(doc, dict):
            raise KubeconfigError(f"kubeconfig {path}", "is not a kubeconfig (no clusters, users, contexts)")
        names += [str(c.get("name")) for c in doc.get("contexts") or [] if isinstance(c, dict)]
        current = current or doc.get("current-context") or None
    if not names:
        raise KubeconfigError(where, "holds no contexts (is it a kubeconfig?)")
    wanted = access.context or current
    if not wanted:
        raise KubeconfigError(where, f"sets no current-context; pick one with --context ({', '.join(names)})")
    if wanted not in names:
        raise KubeconfigError(where, f"has no context {wanted!r} (it has {', '.join(names)})")
    try:
        merged = KubeConfigMerger(os.pathsep.join(files))  # type: ignore[no-untyped-call]
        return KubeConfigLoader(  # type: ignore[no-untyped-call]
            config_dict=merged.config,
            config_base_path=None,
            config_persister=merged.save_changes,
            active_context=wanted,
        )
    except Exception as exc:  # a context naming a missing cluster or user, ...
        raise KubeconfigError(where, f"context {wanted!r}: {_first_line(exc)}") from None


def _yaml_problem(exc: Exception) -> str:
    problem = getattr(exc, "problem", None) or _first_line(exc)
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}" if mark is not None else str(problem)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def contexts(access: Access) -> tuple[list[str], str | None]:
    """(context names, the context ``access`` uses) of a kubeconfig access."""
    loader = _loader(access)
    names = [c["name"] for c in loader.list_contexts()]
    return names, loader.current_context["name"]


def namespace_of(access: Access) -> str:
    """The namespace of the chosen context (``default`` when it names none)."""
    if access.in_cluster:
        try:
            return _SA_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"
    loader = _loader(access)
    ns = (loader.current_context.get("context") or {}).get("namespace")
    return str(ns) if ns else "default"


def configuration(access: Access) -> Any:
    """A ``kubernetes.client.Configuration`` for ``access`` (:class:`KubeconfigError` if unusable)."""
    import kubernetes

    cfg: Any = kubernetes.client.Configuration()
    if access.in_cluster:
        kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cfg
    loader = _loader(access)
    try:
        loader.load_and_set(cfg)
    except Exception as exc:  # a missing certificate file, a failing exec plugin, ...
        raise KubeconfigError(f"kubeconfig {access.kubeconfig}", _first_line(exc)) from None
    return cfg


def api_client(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` of its own (the library's global default is untouched)."""
    import kubernetes

    return kubernetes.client.ApiClient(configuration(choose(kubeconfig, context)))


def kopf_login(**kwargs: Any) -> Any:
    """Body of a ``@kopf.on.login`` handler: the access :func:`choose` picks.

    Without a chosen kubeconfig or context, kopf's own logins (which re-read a rotated
    service account token when the API server says 401). With one, the connection comes
    from that kubeconfig and context, read again at each login.
    """
    import kopf

    access = choose()
    if access.in_cluster:
        return kopf.login_with_service_account(**kwargs)
    if access.context is None and _chosen["kubeconfig"] is None:
        # kopf reads KUBECONFIG itself, or ~/.kube/config: the same file choose() names.
        return kopf.login_with_kubeconfig(**kwargs)
    cfg = configuration(access)
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    scheme: str | None = None
    if token and " " in token:
        scheme, token = token.split(" ", 1)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        default_namespace=namespace_of(access),
    )


def add_flags(parser: Any, *, what: str = "") -> None:
    """``--kubeconfig`` and ``--context`` on a command that talks to a cluster."""
    parser.add_argument(
        "--kubeconfig",
        help=f"{what}kubeconfig file (default: $KUBECONFIG, in a Pod its service account, else ~/.kube/config)",
    )
    parser.add_argument(
        "--context",
        help=f"{what}kubeconfig context to use (default: ${CONTEXT_ENV}, else the current-context)",
    )


def preflight(
    kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None, timeout: float = 10.0
) -> str:
    """Check that the chosen access works before a long-running process relies on it.

    Returns the API server's version. A kubeconfig that cannot be used raises
    :class:`KubeconfigError`; an API server that cannot be reached or refuses the
    credentials raises the client's error (which :mod:`tinct.clierrors` words).
    """
    import kubernetes
    from kubernetes import client

    cfg = configuration(choose(kubeconfig, context))
    cfg.retries = False  # one attempt: an unreachable server is said at once, not after retries
    api = kubernetes.client.ApiClient(cfg)
    try:
        got = client.VersionApi(api).get_code(_request_timeout=timeout)
        return str(got.git_version)
    finally:
        api.close()  # type: ignore[no-untyped-call]
