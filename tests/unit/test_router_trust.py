"""The role header is believed only from peers the router is told to trust."""

from __future__ import annotations

import re

import aiohttp
import pytest

from tinct.cli import main
from tinct.router.config import RouterConfig
from tinct.router.trust import MAX_DECIDED, RoleTrust
from tinct_testing.router_fakes import FakeScheduler, running_router, table


def test_nobody_is_trusted_by_default() -> None:
    trust = RoleTrust()
    assert not trust.allows("127.0.0.1")
    assert not trust.allows("10.1.2.3")


@pytest.mark.parametrize(
    ("networks", "peer", "allowed"),
    [
        (["10.0.0.0/8"], "10.20.30.40", True),
        (["10.0.0.0/8"], "11.0.0.1", False),
        (["10.0.0.0/8"], "::ffff:10.0.0.9", True),  # IPv4 peer on a dual-stack socket
        (["192.168.1.7"], "192.168.1.7", True),
        (["192.168.1.7"], "192.168.1.8", False),
        (["fd00::/8"], "fd12::1", True),
        (["0.0.0.0/0"], "203.0.113.5", True),
        (["10.0.0.0/8"], None, False),
        (["10.0.0.0/8"], "not-an-ip", False),
    ],
)
def test_allows(networks: list[str], peer: str | None, allowed: bool) -> None:
    assert RoleTrust(networks).allows(peer) is allowed


def test_decisions_kept_per_peer_stay_right_and_bounded() -> None:
    trust = RoleTrust(["10.0.0.0/8"])
    for _ in range(2):  # the second round answers from what the first decided
        assert trust.allows("10.0.0.1") is True
        assert trust.allows("11.0.0.1") is False
        assert trust.allows("::ffff:10.0.0.9") is True
        assert trust.allows("not-an-ip") is False
    for i in range(3 * MAX_DECIDED):  # a peer per connection from a large network
        assert trust.allows(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}") is True
    assert len(trust._decided) <= MAX_DECIDED
    assert trust.allows("11.0.0.1") is False


def test_bad_range_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=re.escape("'10.0.0.0/33' is not an IP address or CIDR range")):
        RoleTrust(["10.0.0.0/33"])
    assert main(["router", "--table", "t.json", "--trust-role-from", "nonsense"]) == 2
    assert "'nonsense' is not an IP address" in capsys.readouterr().err


@pytest.mark.parametrize(("trusted", "expected_side"), [((), "v1"), (("127.0.0.1/32",), "v2")])
async def test_admin_header_routes_only_when_the_peer_is_trusted(
    v1: FakeScheduler, v2: FakeScheduler, trusted: tuple[str, ...], expected_side: str
) -> None:
    # admin traffic all to the candidate; everyone else stays on stable.
    tbl = table(v1.url, v2.url, cells=[{"match": {"role": "admin"}, "weight": 100}])
    async with (
        running_router(tbl, RouterConfig(trust_role_from=trusted)) as (base, _),
        aiohttp.ClientSession() as s,
    ):
        for i in range(20):
            async with s.post(
                f"{base}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"X-User-Role": "admin", "X-Session-Id": f"s{i}"},
            ) as r:
                assert r.status == 200
                assert r.headers["X-Scheduler-Active"] == expected_side
