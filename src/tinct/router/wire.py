"""HTTP/1.1 wire pieces shared by the router's server and its upstream client.

Header names and values stay ``bytes`` from the parser to the socket: the router forwards
most headers untouched and decodes (latin-1) only the few it reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

RawHeaders = list[tuple[bytes, bytes]]
#: (lower-cased name, name, value) of each header, in order.
Fields = list[tuple[bytes, bytes, bytes]]

#: RFC 9110 §7.6.1 connection-specific headers, plus the legacy ones proxies drop.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
HOP_BY_HOP_B = frozenset(h.encode() for h in HOP_BY_HOP)

CRLF = b"\r\n"
LAST_CHUNK = b"0\r\n\r\n"

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase of ``status`` (empty for unknown codes)."""
    return _REASONS.get(status, b"")


def chunk(data: bytes) -> bytes:
    """``data`` framed as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


_date_second = 0
_date_value = b""


def http_date() -> bytes:
    """The current IMF-fixdate, recomputed at most once a second."""
    global _date_second, _date_value
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_value = formatdate(now, usegmt=True).encode()
    return _date_value


def connection_tokens(value: bytes) -> frozenset[bytes]:
    """The lower-cased tokens of a ``Connection`` header value."""
    return frozenset(t.strip().lower() for t in value.split(b","))


def header_block(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``Name: value\\r\\n`` lines of ``headers``."""
    return b"".join([b"%b: %b\r\n" % hv for hv in headers])  # a list joins twice as fast as a generator


def simple_response(
    status: int,
    body: bytes,
    content_type: bytes,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> tuple[int, RawHeaders, bytes]:
    """(status, headers, body) of a small answer the router makes itself."""
    return status, [(b"Content-Type", content_type), *extra], body


def json_response(
    status: int, doc: Any, extra: Iterable[tuple[bytes, bytes]] = ()
) -> tuple[int, RawHeaders, bytes]:
    """A small JSON answer made by the router."""
    return simple_response(status, json.dumps(doc).encode(), b"application/json; charset=utf-8", extra)


def text_response(status: int, text: str) -> tuple[int, RawHeaders, bytes]:
    """A small plain-text answer made by the router."""
    return simple_response(status, text.encode(), b"text/plain; charset=utf-8")


__all__ = [
    "CRLF",
    "HOP_BY_HOP",
    "HOP_BY_HOP_B",
    "LAST_CHUNK",
    "Fields",
    "RawHeaders",
    "chunk",
    "connection_tokens",
    "header_block",
    "http_date",
    "json_response",
    "reason_phrase",
    "simple_response",
    "text_response",
]
