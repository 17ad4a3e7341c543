"""Sticky choice between stable and candidate.

``point(key)`` maps a sticky key, salted with the release name, to a number in [0, 100);
a request goes to the candidate when the point is below its cell's weight. The same key
therefore stays on the same side while the weight holds, and moves to the candidate (never
back) as the weight grows; weight 0 sends nothing, 100 everything. Mirroring draws its own
point the same way, salted with ``<release>/shadow`` (:mod:`tinct.router.shadow`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from tinct.router.table import CompiledTable

_SCALE = 100.0 / 2.0**64
REQUEST_ID_HEADER = "X-Request-Id"


def point(table: CompiledTable, key: bytes) -> float:
    """The sticky point of ``key`` for the table's release, uniform in [0, 100)."""
    return salted_point(table.sticky_base, key)


def salted_point(base: hashlib.blake2b, key: bytes) -> float:
    """The point of ``key`` under the salt ``base`` (a hash fed the salt), uniform in [0, 100)."""
    h = base.copy()
    h.update(key)
    return int.from_bytes(h.digest(), "big") * _SCALE


def sticky_key(headers: Mapping[str, str], table: CompiledTable) -> bytes:
    """The configured sticky header, else the request id, else a fresh random key."""
    value = headers.get(table.sticky_header) or headers.get(REQUEST_ID_HEADER)
    return value.encode() if value else os.urandom(8)


def to_candidate(table: CompiledTable, weight: float, key: bytes) -> bool:
    """Whether a request with ``key`` in a cell of ``weight`` percent goes to the candidate."""
    if weight <= 0.0:
        return False
    if weight >= 100.0:
        return True
    return point(table, key) < weight


__all__ = ["REQUEST_ID_HEADER", "point", "salted_point", "sticky_key", "to_candidate"]
