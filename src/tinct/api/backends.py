"""Which backends a release may have the shared routers send traffic to.

A routing table names the URLs of its two backends, and every router of the fleet posts
requests there: a release allowed to name any URL could have the routers post a tenant's
traffic to another tenant's Service, or to the router's own loopback. So a backend is
confined to the release's own namespace — a Service's cluster DNS name
``<service>.<namespace>.svc`` (with or without the cluster domain) — unless the cluster's
administrator allows more: host names (``api.example.com``, ``*.shared.svc.cluster.local``,
where ``*.`` stands for one or more labels) and address ranges (``10.20.0.0/16``, an address)
given to the operator (``--allow-backend``) and to the routers alike.

The operator refuses a release naming anything else (``BackendsAvailable=False``,
``BackendNotAllowed``) and writes no table for it; a router refuses a table that does (it
keeps the last valid one), so a table written any other way cannot reach further either.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from yarl import URL

from tinct.text import listed

__all__ = ["BackendPolicy", "FollowsTables", "parse_allowed"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _network(text: str) -> _Network | None:
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return None


def _host_pattern(text: str) -> str:
    """A host pattern, checked: a DNS name, optionally starting with ``*.``."""
    name = text.lower().rstrip(".")
    bare = name[2:] if name.startswith("*.") else name
    labels = bare.split(".")
    if not bare or len(bare) > 253 or not all(_label(label) for label in labels):
        raise ValueError(
            f"{text!r} is neither a host name (api.example.com, *.shared.svc.cluster.local) nor an "
            "address range (10.0.0.0/8, 127.0.0.1)"
        )
    return name


def _label(label: str) -> bool:
    return 0 < len(label) <= 63 and label.replace("-", "").isalnum() and label[0] != "-" != label[-1]


def parse_allowed(items: str | Iterable[str]) -> tuple[str, ...]:
    """Allowed backends from ``--allow-backend`` values or a ``,``-separated variable, each
    checked (host patterns lower-cased, address ranges normalised)."""
    out: list[str] = []
    for item in listed(items):
        net = _network(item)
        out.append(str(net) if net is not None else _host_pattern(item))
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class BackendPolicy:
    """The backends a release of a namespace may name: that namespace's Services, and
    :attr:`allowed` (host patterns and address ranges, as :func:`parse_allowed` gives them)."""

    allowed: tuple[str, ...] = ()
    #: The cluster's DNS domain: ``<service>.<namespace>.svc.<cluster_domain>`` is a Service.
    cluster_domain: str = "cluster.local"

    def _in_namespace(self, host: str, namespace: str) -> bool:
        for suffix in (f".{namespace}.svc", f".{namespace}.svc.{self.cluster_domain}"):
            if suffix.endswith(".") or not host.endswith(suffix):
                continue
            head = host[: -len(suffix)]
            if head and all(_label(label) for label in head.split(".")):
                return True
        return False

    def _allowed(self, host: str) -> bool:
        address = _network(host)
        for entry in self.allowed:
            net = _network(entry)
            if net is not None:
                if address is not None and address.num_addresses == 1 and address.network_address in net:
                    return True
            elif address is None and (
                host == entry or (entry.startswith("*.") and host.endswith(entry[1:]) and host != entry[2:])
            ):
                return True
        return False

    def refusal(self, url: str, namespace: str | None) -> str | None:
        """Why a release of ``namespace`` may not send traffic to ``url``; None: it may."""
        try:
            host = (URL(url).host or "").lower().rstrip(".")
        except ValueError:
            host = ""
        if not host:
            return f"{url} names no host"
        if namespace and self._in_namespace(host, namespace):
            return None
        if self._allowed(host):
            return None
        own = f"a Service of namespace {namespace} (<service>.{namespace}.svc)" if namespace else "a Service"
        extra = f" or one of {', '.join(self.allowed)}" if self.allowed else ""
        return (
            f"{url} is outside the release's namespace: a backend must be {own}{extra}; "
            "a cluster administrator may allow other hosts with the operator's and the routers' "
            "--allow-backend (the chart's allowBackends)"
        )

    def refusals(self, urls: Sequence[tuple[str, str]], namespace: str | None) -> list[str]:
        """``side: why`` of each ``(side, url)`` the policy refuses."""
        out = []
        for side, url in urls:
            why = self.refusal(url, namespace)
            if why is not None:
                out.append(f"{side}: {why}")
        return out


class FollowsTables:
    """A configuration (a dataclass) that follows routing tables from the cluster: it has the
    ``allow_backends`` and ``cluster_domain`` flags, and :attr:`backends` judges with them."""

    allow_backends: tuple[str, ...]
    cluster_domain: str

    @property
    def backends(self) -> BackendPolicy:
        """Which backends a table from the cluster may name."""
        return BackendPolicy(self.allow_backends, self.cluster_domain)
