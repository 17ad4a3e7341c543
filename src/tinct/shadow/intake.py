"""Which pairs the comparer takes: those a live routing table with a shadow share names.

Pairs are untrusted input (anyone who can reach the comparer with the token can post them),
so a pair is accepted only when a table in force -- not a standing one -- is of its release
(namespace and name), of its uid when the table names one, has shadow settings, and routes
its dye tag to a cell. The refusal reasons are the ``reason`` of
``tinct_shadow_refused_total``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tinct.api.routing import RoutingTable
from tinct.api.v1alpha1.dye import cell_key
from tinct.api.v1alpha1.shadow import ShadowTable
from tinct.router.table import CompiledTable, TableHolder
from tinct.shadow.pair import Pair

__all__ = ["REFUSALS", "Accepted", "Refused", "admit"]

REFUSALS = ("invalid", "unknown_release", "uid", "no_shadow", "dye_tag", "queue_full")


@dataclass(frozen=True)
class Accepted:
    table: RoutingTable
    settings: ShadowTable
    cell: str


@dataclass(frozen=True)
class Refused:
    reason: str


def admit(holder: TableHolder, pair: Pair) -> Accepted | Refused:
    """Whether a table in force of ``holder`` takes ``pair``, and the cell its dye tag is in."""
    tables: list[CompiledTable] = [
        t
        for _, t in holder.tables.values()
        if t.release == pair.release and t.namespace == pair.namespace and not t.table.standing
    ]
    if not tables:
        return Refused("unknown_release")
    tables = [t for t in tables if not t.table.uid or t.table.uid == pair.uid]
    if not tables:
        return Refused("uid")
    with_shadow = [t for t in tables if t.table.shadow is not None]
    if not with_shadow:
        return Refused("no_shadow")
    for t in with_shadow:
        for route in t.routes.values():
            if route.tag == pair.dye_tag:
                assert t.table.shadow is not None
                return Accepted(t.table, t.table.shadow, cell_key(t.table.cells[route.cell].match))
    return Refused("dye_tag")
