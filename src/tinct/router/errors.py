"""Error answers the router makes itself: a fixed message per code and a request id.

An answer the router writes when it refuses or fails a request says what its status means
and nothing of how it came about: no exception name or text, no parser message, no file path,
no backend address. It carries ``X-Request-Id`` — the client's own when it sent a sane one
(:func:`request_id`), else a new one — and the router's log line about it carries the same id
with the detail, so the one leads to the other.

The body is OpenAI-shaped (``{"error": {"message", "type", "code"}}``), so SDKs show it.
Errors about what a classified body says (:class:`~tinct.router.classify.ClassifyError`:
not JSON, no messages, a model not served) keep their own messages, which name the
request's mistake; they carry the request id too.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from tinct.router.wire import RawHeaders, text_response

_log = logging.getLogger("tinct.router")

Answer = tuple[int, RawHeaders, bytes]

REQUEST_ID = b"X-Request-Id"
#: Characters of a client's request id the router repeats (UUIDs, ULIDs, base64, trace ids).
_ID_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:/+=@"
MAX_ID = 128

#: code -> (status, message): every error answer the router makes itself.
CATALOGUE: dict[str, tuple[int, str]] = {
    "bad_request": (400, "The request is not valid HTTP/1.1."),
    "invalid_framing": (
        400,
        "The request's body framing is invalid or ambiguous (Transfer-Encoding, Content-Length).",
    ),
    "invalid_path": (
        400,
        "The request path is refused: it has a dot segment, an empty segment (//), a backslash, "
        "a fragment, or an encoded '.', '/', '\\', '%' or control character.",
    ),
    "not_found": (404, "This router serves no such path."),
    "request_timeout": (408, "The request was not received in time."),
    "request_too_large": (413, "The request body is over the router's limit."),
    "uri_too_long": (414, "The request target is too long."),
    "header_too_large": (431, "The request header section is too large."),
    "internal_error": (500, "The router failed on this request."),
    "unsupported_transfer_coding": (501, "The router accepts no transfer coding but chunked."),
    "stable_unavailable": (502, "The stable backend could not be reached."),
    "bad_gateway": (502, "The stable backend's answer was invalid."),
    "no_routing_table": (503, "The router has no routing table yet."),
}
#: The answer of a metrics port (``/metrics``, ``/healthz``, ``/readyz``) to any other request.
NOT_LOCAL = text_response(404, "not found: /metrics, /healthz, /readyz\n")
_TYPE = {400: "invalid_request_error", 404: "invalid_request_error"}
_JSON = (b"Content-Type", b"application/json; charset=utf-8")


def _body(code: str) -> bytes:
    status, message = CATALOGUE[code]
    return json.dumps(
        {"error": {"message": message, "type": _TYPE.get(status, "router_error"), "code": code}}
    ).encode()


_BODIES = {code: _body(code) for code in CATALOGUE}


def status_of(code: str) -> int:
    """The status of the error ``code``."""
    return CATALOGUE[code][0]


def request_id(given: bytes | None) -> bytes:
    """``given`` (the client's ``X-Request-Id``) when it is sane — 1 to :data:`MAX_ID`
    characters of letters, digits and ``-_.:/+=@`` — else a new random id."""
    if given and len(given) <= MAX_ID and not given.translate(None, _ID_CHARS):
        return given
    return os.urandom(16).hex().encode()


def error_answer(code: str, rid: bytes, extra: Iterable[tuple[bytes, bytes]] = ()) -> Answer:
    """The router's own error answer of ``code`` (see :data:`CATALOGUE`), with request id ``rid``."""
    return CATALOGUE[code][0], [_JSON, (REQUEST_ID, rid), *extra], _BODIES[code]


def log_refusal(
    rid: bytes, peer: str | None, status: int, code: str, detail: str, level: int = logging.INFO
) -> None:
    """The log line of an error answer: its request id, the peer, the status and the detail
    the answer leaves out."""
    _log.log(level, "request %s from %s: %d %s: %s", rid.decode("ascii"), peer or "-", status, code, detail)


def with_request_id(answer: Answer, rid: bytes) -> Answer:
    """``answer`` with ``X-Request-Id: rid`` added."""
    status, headers, body = answer
    return status, [*headers, (REQUEST_ID, rid)], body


__all__ = [
    "CATALOGUE",
    "MAX_ID",
    "NOT_LOCAL",
    "REQUEST_ID",
    "Answer",
    "error_answer",
    "log_refusal",
    "request_id",
    "status_of",
    "with_request_id",
]
