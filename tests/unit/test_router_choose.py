"""Sticky choice: stable per key, share matching the weight, monotone in the weight."""

from __future__ import annotations

import pytest

from tinct.router.choose import point, sticky_key, to_candidate
from tinct.router.table import CompiledTable
from tinct_testing.router_fakes import table

KEYS = [f"session-{i}".encode() for i in range(10_000)]


@pytest.fixture
def ct() -> CompiledTable:
    return CompiledTable(table("http://127.0.0.1:1", "http://127.0.0.1:2"))


def test_same_key_same_side(ct: CompiledTable) -> None:
    for k in KEYS[:200]:
        first = to_candidate(ct, 37.5, k)
        assert all(to_candidate(ct, 37.5, k) == first for _ in range(5))
        assert 0.0 <= point(ct, k) < 100.0


@pytest.mark.parametrize("weight", [0.1, 1, 10, 50, 90])
def test_share_over_many_keys_matches_the_weight(ct: CompiledTable, weight: float) -> None:
    hits = sum(to_candidate(ct, weight, k) for k in KEYS)
    p = weight / 100
    sd = (len(KEYS) * p * (1 - p)) ** 0.5
    assert abs(hits - len(KEYS) * p) <= 5 * sd + 1


def test_weight_zero_never_and_hundred_always(ct: CompiledTable) -> None:
    assert not any(to_candidate(ct, 0, k) for k in KEYS)
    assert all(to_candidate(ct, 100, k) for k in KEYS)


def test_growing_weight_never_moves_a_key_back_to_stable(ct: CompiledTable) -> None:
    at10 = {k for k in KEYS if to_candidate(ct, 10, k)}
    at20 = {k for k in KEYS if to_candidate(ct, 20, k)}
    assert at10 <= at20
    assert len(at20) > len(at10)


def test_release_name_salts_the_hash(ct: CompiledTable) -> None:
    other = CompiledTable(table("http://127.0.0.1:1", "http://127.0.0.1:2", release="search"))
    a = {k for k in KEYS if to_candidate(ct, 50, k)}
    b = {k for k in KEYS if to_candidate(other, 50, k)}
    assert a != b
    overlap = len(a & b) / len(KEYS)
    assert 0.15 < overlap < 0.35  # independent halves overlap by about a quarter


def test_sticky_key_header_then_request_id_then_random(ct: CompiledTable) -> None:
    assert sticky_key({"X-Session-Id": "s1", "X-Request-Id": "r1"}, ct) == b"s1"
    assert sticky_key({"X-Request-Id": "r1"}, ct) == b"r1"
    assert sticky_key({}, ct) != sticky_key({}, ct)
