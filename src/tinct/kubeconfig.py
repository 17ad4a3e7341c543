"""How every tinct process reaches the Kubernetes API: one order, decided at call time.

The order is the one controller-runtime and kubectl users expect:

1. a kubeconfig named explicitly (a ``--kubeconfig`` flag);
2. the kubeconfig(s) ``KUBECONFIG`` names;
3. the Pod's service account, when running in a cluster;
4. ``~/.kube/config``.

The environment is read when a client is made, not when a module is imported (the
``kubernetes`` package freezes ``KUBECONFIG`` at import), so a process that sets it late —
a test, a wrapper — gets what it set. The operator's kopf login and its status patches
and the router's ConfigMap watch all go through :func:`choose`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Access", "api_client", "choose", "kopf_login"]

#: Where a Pod's service account token is mounted.
_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True)
class Access:
    """The chosen way in: the in-cluster service account, or a kubeconfig file (list)."""

    in_cluster: bool
    kubeconfig: str | None = None  # None when in_cluster

    def __str__(self) -> str:
        return "in-cluster service account" if self.in_cluster else f"kubeconfig {self.kubeconfig}"


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and _TOKEN.is_file()


def choose(kubeconfig: str | os.PathLike[str] | None = None) -> Access:
    """The access to use now, in the order of the module docs."""
    if kubeconfig is not None:
        return Access(in_cluster=False, kubeconfig=os.fspath(kubeconfig))
    from_env = os.environ.get("KUBECONFIG")
    if from_env:
        return Access(in_cluster=False, kubeconfig=from_env)
    if _in_cluster():
        return Access(in_cluster=True)
    return Access(in_cluster=False, kubeconfig=os.path.expanduser("~/.kube/config"))


def api_client(kubeconfig: str | os.PathLike[str] | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` of its own (the library's global default is untouched)."""
    import kubernetes

    access = choose(kubeconfig)
    if access.in_cluster:
        cfg: Any = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return kubernetes.client.ApiClient(cfg)
    return kubernetes.config.new_client_from_config(config_file=access.kubeconfig)  # type: ignore[no-untyped-call]


def kopf_login(**kwargs: Any) -> Any:
    """Body of a ``@kopf.on.login`` handler: kopf's own login for the access :func:`choose` picks.

    kopf's own logins (rather than the ``kubernetes`` client's) re-read a rotated service
    account token and re-run kubeconfig exec plugins when the API server says 401.
    """
    import kopf

    access = choose()
    if access.in_cluster:
        return kopf.login_with_service_account(**kwargs)
    # kopf reads KUBECONFIG itself, or ~/.kube/config: the same file choose() names.
    return kopf.login_with_kubeconfig(**kwargs)
