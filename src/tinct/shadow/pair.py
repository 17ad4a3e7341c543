"""A pair: one mirrored request and both answers, as a router sends it to the comparer.

``POST /v1/pairs`` carries them as NDJSON, one :class:`Pair` a line (the wire format is in
docs/router.md, section "Mirroring"). Pairs are untrusted input: every field is bounded here, and the
comparer accepts a pair only for a release, uid and dye tag a routing table with a shadow
share names (:mod:`tinct.shadow.intake`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["MAX_BODY_BYTES", "Answer", "Pair", "PairError", "Request", "parse_pair"]

#: The largest body of a request or an answer a pair may carry (decoded).
MAX_BODY_BYTES = 16 * 1024 * 1024

CandidateError = Literal["timeout", "unreachable", "reset", "bad_answer"]


class PairError(ValueError):
    """A line that is not a pair; the message says which field and why."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Request(_Wire):
    path: str = Field(max_length=256)
    body: str = Field(max_length=MAX_BODY_BYTES)
    prompt_tokens: int = Field(default=0, ge=0, le=100_000_000)


class Answer(_Wire):
    """One side's answer, cut at the release's ``shadow.maxBytes`` (``truncated``)."""

    status: int | None = Field(default=None, ge=100, le=599)
    content_type: str = Field(default="", max_length=256)
    body_b64: str = Field(default="", max_length=MAX_BODY_BYTES * 4 // 3 + 4)
    truncated: bool = False
    ms: float | None = Field(default=None, ge=0)
    error: CandidateError | None = None

    def body(self) -> bytes:
        """The answer's bytes.

        Raises:
            PairError: ``body_b64`` is not base64.
        """
        try:
            return base64.b64decode(self.body_b64, validate=True)
        except (binascii.Error, ValueError):
            raise PairError("body_b64 is not base64") from None


class Pair(_Wire):
    v: Literal[1]
    namespace: str = Field(default="", max_length=63)
    release: str = Field(min_length=1, max_length=253)
    uid: str = Field(default="", max_length=128)
    table_version: int = Field(default=0, ge=0)
    dye_tag: str = Field(min_length=1, max_length=256)
    target: Literal["candidate", "stable"]
    time: float = Field(ge=0)
    request: Request
    stable: Answer
    candidate: Answer

    #: A digest of the line as sent: a pair sent twice is one row.
    digest: str = ""


def parse_pair(line: bytes) -> Pair:
    """One NDJSON line as a :class:`Pair`.

    Raises:
        PairError: not JSON, or a field missing, of the wrong type or out of bounds.
    """
    try:
        pair = Pair.model_validate_json(line)
    except ValidationError as e:
        where = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'pair'}: {err['msg']}" for err in e.errors()
        )
        raise PairError(where[:500]) from None
    return pair.model_copy(update={"digest": hashlib.sha256(line).hexdigest()[:32]})
