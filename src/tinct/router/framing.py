"""How a request's body is framed, decided from its head before any of it is forwarded.

RFC 9112 §6: a body is delimited by ``Transfer-Encoding: chunked`` or by ``Content-Length``,
and a head that leaves the delimitation in doubt is refused, so that no two parties on the
way (the router, a backend, a proxy in front) can read a different request out of the same
bytes. The router decides once, from the head alone, when the head is complete, and refuses
before the handler starts:

- ``Transfer-Encoding`` (its field values parsed as one list, codings compared as tokens,
  case-insensitively: ``xchunked`` is not ``chunked``) is accepted only as exactly
  ``chunked``. A final coding other than ``chunked`` leaves the length undetermined: ``400``,
  or ``501`` when a coding is not a registered one. ``chunked`` after other codings
  (``gzip, chunked``) frames the body but applies a coding the router does not implement
  (the field is hop-by-hop, so it cannot be passed on): ``501``. ``chunked`` twice, an empty
  list, ``Transfer-Encoding`` with ``Content-Length`` or in an HTTP/1.0 request: ``400``.
- ``Content-Length`` must be one field of decimal digits (optional whitespace around it):
  several fields (even equal ones) or anything but digits: ``400``.

The parser (llhttp) refuses some of these on its own, as it reads the head; the rest it
would refuse only after the head, once the request was handed on. These rules run at the
end of the head, so both kinds are refused before anything is forwarded.
"""

from __future__ import annotations

#: The transfer codings of the IANA registry (RFC 9112 §7, RFC 9110 §18.7); any other is
#: unknown (``501``).
KNOWN_CODINGS = frozenset({b"chunked", b"compress", b"deflate", b"gzip", b"x-compress", b"x-gzip"})
#: Digits of a Content-Length beyond which llhttp overflows (2**64 has 20).
_MAX_DIGITS = 19
_OWS = b" \t"


class FramingError(ValueError):
    """The request's body cannot be framed safely: answered ``status`` (``code``), never forwarded.

    Also what a body fails with when its framing breaks midway (a garbage chunk size).
    """

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def codings(values: list[bytes]) -> list[bytes]:
    """The transfer codings of ``Transfer-Encoding`` field values, in order, lower-cased, each
    with its parameters (RFC 9110 §5.6.1 lists: empty elements are dropped)."""
    out: list[bytes] = []
    for value in values:
        for item in value.split(b","):
            item = item.strip(_OWS)
            if item:
                out.append(item.lower())
    return out


def final_chunked(values: list[bytes]) -> bool:
    """The final coding of ``Transfer-Encoding`` field values is exactly ``chunked``."""
    c = codings(values)
    return bool(c) and c[-1] == b"chunked"


def _bad(detail: str) -> FramingError:
    return FramingError(400, "invalid_framing", detail)


def request_framing(te: list[bytes], cl: list[bytes], version: str) -> tuple[bool, int | None]:
    """(chunked, declared length) of a request body from its ``Transfer-Encoding`` and
    ``Content-Length`` field values.

    Raises:
        FramingError: the head leaves the body's framing in doubt, or names a transfer coding
            the router does not implement.
    """
    if te:
        if cl:
            raise _bad("Transfer-Encoding together with Content-Length")
        if version != "1.1":
            raise _bad(f"Transfer-Encoding in an HTTP/{version} request")
        cs = codings(te)
        if cs == [b"chunked"]:
            return True, None
        if not cs:
            raise _bad("an empty Transfer-Encoding")
        names = [c.split(b";", 1)[0].strip(_OWS) for c in cs]
        shown = b", ".join(cs).decode("latin-1")
        if cs[-1] != b"chunked":
            if any(n not in KNOWN_CODINGS for n in names):
                raise FramingError(
                    501, "unsupported_transfer_coding", f"unknown transfer coding in {shown!r}"
                )
            raise _bad(f"the final transfer coding is not chunked: {shown!r}")
        if names.count(b"chunked") > 1:
            raise _bad(f"chunked applied more than once: {shown!r}")
        raise FramingError(501, "unsupported_transfer_coding", f"transfer codings besides chunked: {shown!r}")
    if cl:
        if len(cl) > 1:
            raise _bad(f"{len(cl)} Content-Length fields")
        value = cl[0].strip(_OWS)
        if not value.isdigit() or len(value) > _MAX_DIGITS:
            raise _bad(f"Content-Length is not a decimal number: {value[:40]!r}")
        return False, int(value)
    return False, None


__all__ = ["KNOWN_CODINGS", "FramingError", "codings", "final_chunked", "request_framing"]
