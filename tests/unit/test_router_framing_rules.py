"""How the router decides the framing of a request body from its head (RFC 9112 §6): the rules
themselves, on the header values a head can carry. ``tests/integration/test_router_framing.py``
sends such requests to a real router process."""

from __future__ import annotations

import pytest

from tinct.router.framing import FramingError, request_framing


@pytest.mark.parametrize(
    ("te", "cl", "version", "decision"),
    [
        ([b"chunked"], [], "1.1", (True, None)),
        ([b" CHUNKED "], [], "1.1", (True, None)),
        ([b"chunked,"], [], "1.1", (True, None)),  # list syntax: empty elements are dropped
        ([], [b" 42 "], "1.1", (False, 42)),
        ([], [], "1.1", (False, None)),
        ([b"chunked", b"chunked"], [], "1.1", 400),
        ([b"chunked, gzip"], [], "1.1", 400),
        ([b"gzip"], [], "1.1", 400),
        ([b"chunked;q=1"], [], "1.1", 400),
        ([b"xchunked"], [], "1.1", 501),
        ([b"chunkedx"], [], "1.1", 501),
        ([b"gzip", b"chunked"], [], "1.1", 501),
        ([b" , "], [], "1.1", 400),
        ([b"chunked"], [b"5"], "1.1", 400),
        ([b"chunked"], [], "1.0", 400),
        ([], [b"5", b"5"], "1.1", 400),
        ([], [b"5,5"], "1.1", 400),
        ([], [b"\xb5"], "1.1", 400),  # a digit to str.isdigit, not to bytes
        ([], [b"1" * 20], "1.1", 400),
    ],
)
def test_the_framing_rules_themselves(
    te: list[bytes], cl: list[bytes], version: str, decision: tuple[bool, int | None] | int
) -> None:
    """The rules as the router applies them, also where llhttp refuses a head first today."""
    if isinstance(decision, tuple):
        assert request_framing(te, cl, version) == decision
    else:
        with pytest.raises(FramingError) as caught:
            request_framing(te, cl, version)
        assert caught.value.status == decision
