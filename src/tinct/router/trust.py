"""Who may set a caller's role through the dye role header.

A role picks a cell, and a cell can send its callers to the candidate: a header any
client can write must not pick it. By default no peer is trusted and every request gets
the configured default role. The router is told which peers to trust, usually the
address range of the gateway that authenticates callers and sets the header
(``--trust-role-from 10.0.0.0/8``); ``0.0.0.0/0`` trusts every IPv4 peer, for a router
that only a gateway can reach.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Peers whose decision is kept; past that many the record starts afresh.
MAX_DECIDED = 4096


class RoleTrust:
    """The peer networks whose role header is believed."""

    def __init__(self, networks: Iterable[str] = ()) -> None:
        parsed: list[_Network] = []
        for spec in networks:
            try:
                parsed.append(ipaddress.ip_network(spec.strip(), strict=False))
            except ValueError:
                raise ValueError(f"--trust-role-from: {spec!r} is not an IP address or CIDR range") from None
        self.networks: tuple[_Network, ...] = tuple(parsed)
        #: Peers already decided: parsing an address costs more than the rest of a request's
        #: classification, and a router hears from few peers (its gateways) over and over.
        self._decided: dict[str, bool] = {}

    def allows(self, peer: str | None) -> bool:
        """Whether the role header of a request from ``peer`` (an IP address) is believed."""
        if not self.networks or not peer:
            return False
        decided = self._decided.get(peer)
        if decided is None:
            if len(self._decided) >= MAX_DECIDED:
                self._decided.clear()
            decided = self._decided[peer] = self._decide(peer)
        return decided

    def _decide(self, peer: str) -> bool:
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self.networks)

    def __repr__(self) -> str:
        return f"RoleTrust({[str(n) for n in self.networks]})"


__all__ = ["MAX_DECIDED", "RoleTrust"]
